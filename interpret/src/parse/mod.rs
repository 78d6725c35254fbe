//! Parsing the serialized Mosaic body: MLIR's generic operation syntax (every op as
//! `"stable_mosaic.<dialect>.<op>"(operands) ({regions}) {attrs} : (types) -> types`),
//! regions and blocks with typed arguments, the builtin and `tpu` types, and the attributes
//! Mosaic ops carry. Hand-written; no MLIR dependency.

mod ast;
mod parser;

pub use ast::*;
pub use parser::ParseError;

/// Parse a module (the `tpu_custom_call` body text).
pub fn parse_module(text: &str) -> Result<ModuleAst, ParseError> {
    parser::Parser::new(text).parse_module()
}

/// Parse a single type (handy for tests and call specs).
pub fn parse_type(text: &str) -> Result<Type, ParseError> {
    parser::Parser::new(text).parse_type()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generic_syntax_variants() {
        let text = r#"#loc = loc("k.py":1:2)
module attributes {stable_mosaic.version = 11 : i64} {
  "stable_mosaic.func.func"() <{function_type = (i32) -> (i32, i32), sym_name = "f"}> ({
  ^bb0(%arg0: i32 loc("x")):
    %c = "stable_mosaic.arith.constant"() {value = dense<[[1.0, 2.5], [0x7F800000, -3.0]]> : vector<2x2xf32>} : () -> vector<2x2xf32> loc(#loc)
    %m = "stable_mosaic.arith.constant"() {value = dense<0xFF80> : vector<4xbf16>} : () -> vector<4xbf16>
    %h = "stable_mosaic.arith.constant"() {value = dense<"0x0000803F"> : vector<2xf32>} : () -> vector<2xf32>
    %r:2 = "stable_mosaic.scf.while"(%arg0, %arg0) ({
    ^bb0(%a: i32, %b: i32):
      %t = "stable_mosaic.arith.constant"() {value = true} : () -> i1
      "stable_mosaic.scf.condition"(%t, %a, %b) : (i1, i32, i32) -> ()
    }, {
    ^bb0(%a: i32, %b: i32):
      "stable_mosaic.scf.yield"(%a, %b) : (i32, i32) -> ()
    }) {attr = #tpu.dot_dimension_numbers<[1], [0], [0], [1], [0, 0, 1, 1], [], []>, p = #tpu.contract_precision<fp32>, "quoted key" = @sym::@nested, u, a = array<i64>, f = #arith.fastmath<none>, d = {x = [1 : i32, "s", unit]}} : (i32, i32) -> (i32, i32)
    "stable_mosaic.func.return"(%r#0, %r#1) : (i32, i32) -> ()
  }) : () -> ()
}
"#;
        let m = parse_module(text).unwrap_or_else(|e| panic!("{e}"));
        assert!(m.serialized);
        let f = &m.ops[0];
        assert_eq!(f.attr("sym_name"), Some(&Attr::String("f".into())));
        let body = &f.regions[0].blocks[0];
        assert_eq!(body.args, vec![("arg0".to_string(), Type::Int(32))]);
        let Some(Attr::Dense { elems, splat: false, .. }) = body.ops[0].attr("value") else {
            panic!()
        };
        assert_eq!(elems.len(), 4);
        assert_eq!(elems[2], DenseElem::Bits(0x7F80_0000));
        assert!(
            matches!(body.ops[2].attr("value"), Some(Attr::DenseHex { bytes, .. }) if bytes == &[0, 0, 0x80, 0x3f])
        );
        let w = &body.ops[3];
        assert_eq!(w.results, vec!["r#0".to_string(), "r#1".to_string()]);
        assert!(
            matches!(w.attr("attr"), Some(Attr::DotDims(d)) if d.output_dim_order == vec![0, 0, 1, 1])
        );
        assert_eq!(w.attr("p").and_then(|a| a.dialect("tpu.contract_precision")), Some("fp32"));
        assert_eq!(w.attr("quoted key"), Some(&Attr::SymbolRef("sym::nested".into())));
        assert_eq!(w.attr("u"), Some(&Attr::Unit));
        assert_eq!(w.attr("a"), Some(&Attr::DenseArray { elem: Type::Int(64), values: vec![] }));
        assert_eq!(body.ops[4].operands, vec!["r#0".to_string(), "r#1".to_string()]);
        let t =
            parse_type("memref<2x?x!tpu.dma_semaphore, #tpu.memory_space<semaphore_mem>>").unwrap();
        assert_eq!(t.memory_space(), Some("semaphore_mem"));
        assert_eq!(
            t.to_string(),
            "memref<2x?x!tpu.dma_semaphore, #tpu.memory_space<semaphore_mem>>"
        );
    }

    #[test]
    fn locations_resolve_through_aliases() {
        // MLIR prints location aliases after the module; names and call sites wrap files.
        let text = r#"module {
  %c1 = "stable_mosaic.arith.constant"() {value = 1 : i32} : () -> i32 loc(#loc1)
  %c2 = "stable_mosaic.arith.constant"() {value = 2 : i32} : () -> i32 loc("kernels/src/a.rs":7:13)
  %c3 = "stable_mosaic.arith.constant"() {value = 3 : i32} : () -> i32 loc(#loc3)
  %c4 = "stable_mosaic.arith.constant"() {value = 4 : i32} : () -> i32 loc(unknown)
  %c5 = "stable_mosaic.arith.constant"() {value = 5 : i32} : () -> i32
} loc(#loc)
#loc = loc(unknown)
#loc1 = loc("kernels/src/a.rs":3:5)
#loc2 = loc("k.py":12:4)
#loc3 = loc("add"(#loc2))
"#;
        let m = parse_module(text).unwrap_or_else(|e| panic!("{e}"));
        let src: Vec<Option<&str>> = m.ops.iter().map(|o| o.src.as_deref()).collect();
        assert_eq!(
            src,
            [
                Some("kernels/src/a.rs:3:5"),
                Some("kernels/src/a.rs:7:13"),
                Some("k.py:12:4"),
                None,
                None
            ]
        );
    }
}
