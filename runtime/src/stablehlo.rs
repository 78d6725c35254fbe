//! A lowered kernel as the StableHLO program libtpu compiles: one
//! `stablehlo.custom_call @tpu_custom_call` of the serialized Mosaic body, exactly what JAX's
//! lowering of a `pallas_call` produces (`jax/_src/tpu_custom_call.py`): the body base64 in
//! `backend_config.custom_call_config` with `serialization_format: 1` and
//! `needs_layout_passes: true`, the VMEM limit as a `scoped_memory_configs` entry, row-major
//! operand and result layouts, aliases as `output_operand_aliases`, and `kernel_name`.
//!
//! Aliased inputs are also donated (`tf.aliasing_output` on the argument), as a caller that
//! passes the buffer in place does: otherwise XLA copies the input to honour the alias.
//! A multi-device kernel (a call spec with `devices`) runs on each of its devices as
//! `jax.shard_map` runs a Pallas kernel over a 1-D mesh `x`: the program's arrays stack the
//! per-device operands along dim 0, sharded over the devices, and the custom call runs in
//! an `sdy.manual_computation` (JAX's Shardy lowering); the backend config gains
//! `has_communication` and `collective_id` as JAX writes them.

use base64::Engine;
use palladium_dsl::DType;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// One full array of the call: `bf16[1024,2048]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArrayType {
    pub dtype: DType,
    pub dims: Vec<u64>,
}

impl ArrayType {
    /// `tensor<1024x2048xbf16>`.
    pub fn tensor(&self) -> String {
        let element = match self.dtype {
            DType::Bf16 => "bf16",
            DType::F16 => "f16",
            DType::F32 => "f32",
            DType::F8E4M3 => "f8E4M3FN",
            DType::F8E5M2 => "f8E5M2",
            DType::I32 => "i32",
            DType::I16 => "i16",
            DType::I8 => "i8",
            DType::I4 => "i4",
            DType::Bool => "i1",
        };
        let mut s = String::from("tensor<");
        for d in &self.dims {
            s.push_str(&format!("{d}x"));
        }
        s.push_str(element);
        s.push('>');
        s
    }

    /// Row-major layout, minor to major: `dense<[1, 0]> : tensor<2xindex>`.
    fn layout(&self) -> String {
        let rank = self.dims.len();
        let order: Vec<String> = (0..rank).rev().map(|d| d.to_string()).collect();
        format!("dense<[{}]> : tensor<{rank}xindex>", order.join(", "))
    }

    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

impl fmt::Display for ArrayType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dims: Vec<String> = self.dims.iter().map(u64::to_string).collect();
        write!(f, "{}[{}]", self.dtype, dims.join(","))
    }
}

impl FromStr for ArrayType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("bad array type `{s}`: write e.g. bf16[1024,2048]");
        let (dtype, rest) = s.trim().split_once('[').ok_or_else(bad)?;
        let dims = rest.strip_suffix(']').ok_or_else(bad)?;
        let dtype: DType = dtype.parse()?;
        let dims = dims
            .split(',')
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .map(|d| d.parse::<u64>().map_err(|_| bad()))
            .collect::<Result<_, _>>()?;
        Ok(ArrayType { dtype, dims })
    }
}

impl Serialize for ArrayType {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for ArrayType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// The call spec of a lowered kernel (`Lowered::call_json`, `KERNEL.call.json`): the full
/// arrays passed to the custom call (scalar prefetch, then inputs) and its results.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallSpec {
    pub inputs: Vec<ArrayType>,
    pub outputs: Vec<ArrayType>,
    #[serde(default)]
    pub vmem_limit_bytes: Option<u64>,
    /// `[custom-call operand, result]` pairs.
    #[serde(default)]
    pub input_output_aliases: Vec<[usize; 2]>,
    pub name: String,
    /// Multi-device kernels: the number of devices (operand types are then per device).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices: Option<u64>,
    /// The mesh axes (name, size), as `palladium_lowering` writes them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mesh: Option<Vec<(String, u64)>>,
    /// The body names another device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub has_communication: Option<bool>,
    /// `CompilerParams(collective_id=..)`: the barrier semaphore's collective.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collective_id: Option<u32>,
}

impl CallSpec {
    /// Parse a call spec JSON; the error names the field that is wrong.
    pub fn from_json(text: &str) -> Result<CallSpec, String> {
        let spec: CallSpec =
            serde_json::from_str(text).map_err(|e| format!("bad call spec: {e}"))?;
        spec.check()?;
        Ok(spec)
    }

    fn check(&self) -> Result<(), String> {
        if self.outputs.is_empty() {
            return Err(format!("call spec of `{}`: no outputs", self.name));
        }
        if self.devices.unwrap_or(1) > 1
            && let Some(t) = self.inputs.iter().chain(&self.outputs).find(|t| t.dims.is_empty())
        {
            return Err(format!(
                "call spec of `{}`: the scalar {t} cannot be split over devices (operands stack along dim 0)",
                self.name
            ));
        }
        for &[i, o] in &self.input_output_aliases {
            let (Some(a), Some(b)) = (self.inputs.get(i), self.outputs.get(o)) else {
                return Err(format!(
                    "call spec of `{}`: alias [{i}, {o}] names no such input/output",
                    self.name
                ));
            };
            if a != b {
                return Err(format!(
                    "call spec of `{}`: alias [{i}, {o}] joins {a} and {b}",
                    self.name
                ));
            }
        }
        Ok(())
    }
}

/// The `backend_config` JSON of the custom call, as JAX writes it.
pub fn backend_config(body: &[u8], spec: &CallSpec) -> String {
    let body = base64::engine::general_purpose::STANDARD.encode(body);
    let mut config = format!("{{\"custom_call_config\": {{\"body\": \"{body}\"");
    if spec.has_communication == Some(true) {
        config.push_str(", \"has_communication\": true");
    }
    if let Some(id) = spec.collective_id {
        config.push_str(&format!(", \"collective_id\": {id}"));
    }
    config.push_str(", \"serialization_format\": 1, \"needs_layout_passes\": true}");
    if let Some(limit) = spec.vmem_limit_bytes {
        config.push_str(&format!(", \"scoped_memory_configs\": [{{\"memory_space\":1, \"offset\": 0, \"size\": {limit}}}]"));
    }
    config.push('}');
    config
}

/// An MLIR string literal: `"` and `\` escaped as hex.
fn mlir_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\22"),
            '\\' => out.push_str("\\5C"),
            '\n' => out.push_str("\\0A"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The StableHLO module (text) calling the serialized Mosaic `body` with the operands and
/// results of `spec`: the program libtpu compiles for the kernel.
pub fn wrap(body: &str, spec: &CallSpec) -> Result<String, String> {
    spec.check()?;
    let ins: Vec<String> = spec.inputs.iter().map(ArrayType::tensor).collect();
    let outs: Vec<String> = spec.outputs.iter().map(ArrayType::tensor).collect();
    let args: Vec<String> = ins
        .iter()
        .enumerate()
        .map(|(i, t)| match spec.input_output_aliases.iter().find(|a| a[0] == i) {
            Some(&[_, o]) => format!("%arg{i}: {t} {{tf.aliasing_output = {o} : i32}}"),
            None => format!("%arg{i}: {t}"),
        })
        .collect();
    let operands: Vec<String> = (0..ins.len()).map(|i| format!("%arg{i}")).collect();
    let layouts =
        |ts: &[ArrayType]| ts.iter().map(ArrayType::layout).collect::<Vec<_>>().join(", ");
    let single = outs.len() == 1;
    let aliases: Vec<String> = spec
        .input_output_aliases
        .iter()
        .map(|&[i, o]| {
            let tuple = if single { String::new() } else { o.to_string() };
            format!("#stablehlo.output_operand_alias<output_tuple_indices = [{tuple}], operand_index = {i}, operand_tuple_indices = []>")
        })
        .collect();
    let mut attrs = vec![
        format!("backend_config = {}", mlir_string(&backend_config(body.as_bytes(), spec))),
        format!("kernel_name = {}", mlir_string(&spec.name)),
    ];
    attrs.push(format!("operand_layouts = [{}]", layouts(&spec.inputs)));
    if !aliases.is_empty() {
        attrs.push(format!("output_operand_aliases = [{}]", aliases.join(", ")));
    }
    attrs.push(format!("result_layouts = [{}]", layouts(&spec.outputs)));
    let result_types = if single { outs[0].clone() } else { format!("({})", outs.join(", ")) };
    let (lhs, returned) = if single {
        ("%0".to_string(), "%0".to_string())
    } else {
        (
            format!("%0:{}", outs.len()),
            (0..outs.len()).map(|o| format!("%0#{o}")).collect::<Vec<_>>().join(", "),
        )
    };
    let module_name: String =
        spec.name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    let call = |operands: &[String]| {
        format!(
            "stablehlo.custom_call @tpu_custom_call({}) {{{}}} : ({}) -> {result_types}",
            operands.join(", "),
            attrs.join(", "),
            ins.join(", ")
        )
    };
    let devices = spec.devices.unwrap_or(1);
    if devices == 1 {
        return Ok(format!(
            "module @{module_name} attributes {{mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32}} {{\n  func.func public @main({}) -> {result_types} {{\n    {lhs} = {}\n    return {returned} : {}\n  }}\n}}\n",
            args.join(", "),
            call(&operands),
            outs.join(", "),
        ));
    }
    // Each device's operands are one dim-0 slice of the program's arrays: the custom call runs
    // in a Shardy manual computation over a 1-D mesh, as JAX lowers a `shard_map`.
    let global = |t: &ArrayType| {
        let mut dims = t.dims.clone();
        dims[0] *= devices;
        ArrayType { dtype: t.dtype, dims }.tensor()
    };
    let sharding = |t: &ArrayType| {
        let dims: Vec<&str> =
            std::iter::once("{\"x\"}").chain((1..t.dims.len()).map(|_| "{}")).collect();
        format!("<@mesh, [{}]>", dims.join(", "))
    };
    let shardings = |ts: &[ArrayType]| ts.iter().map(sharding).collect::<Vec<_>>().join(", ");
    // An aliased input is donated to its output, as `jax.jit(donate_argnums=..)` marks it;
    // each device's custom call aliases its own slices.
    let params: Vec<String> = spec
        .inputs
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let donated = spec
                .input_output_aliases
                .iter()
                .find(|a| a[0] == i)
                .map(|&[_, o]| format!(", tf.aliasing_output = {o} : i32"))
                .unwrap_or_default();
            format!(
                "%arg{i}: {} {{sdy.sharding = #sdy.sharding{}{donated}}}",
                global(t),
                sharding(t)
            )
        })
        .collect();
    let locals: Vec<String> =
        spec.inputs.iter().enumerate().map(|(i, t)| format!("%local{i}: {}", t.tensor())).collect();
    let local_names: Vec<String> = (0..spec.inputs.len()).map(|i| format!("%local{i}")).collect();
    let globals: Vec<String> = spec.outputs.iter().map(global).collect();
    let global_ins: Vec<String> = spec.inputs.iter().map(global).collect();
    let global_results =
        if single { globals[0].clone() } else { format!("({})", globals.join(", ")) };
    let (manual, results) = if single {
        ("%0".to_string(), "%0".to_string())
    } else {
        (
            format!("%0:{}", outs.len()),
            (0..outs.len()).map(|o| format!("%0#{o}")).collect::<Vec<_>>().join(", "),
        )
    };
    Ok(format!(
        "module @{module_name} attributes {{mhlo.num_partitions = {devices} : i32, mhlo.num_replicas = 1 : i32}} {{\n  sdy.mesh @mesh = <[\"x\"={devices}]>\n  func.func public @main({}) -> {global_results} {{\n    {manual} = sdy.manual_computation({}) in_shardings=[{}] out_shardings=[{}] manual_axes={{\"x\"}} ({}) {{\n      {lhs} = {}\n      sdy.return {returned} : {}\n    }} : ({}) -> {global_results}\n    return {results} : {}\n  }}\n}}\n",
        params.join(", "),
        operands.join(", "),
        shardings(&spec.inputs),
        shardings(&spec.outputs),
        locals.join(", "),
        call(&local_names),
        outs.join(", "),
        global_ins.join(", "),
        globals.join(", "),
    ))
}

/// The `mhlo.num_partitions` a program declares (1 where it declares none): the partitions
/// it is compiled for.
pub fn num_partitions(program: &str) -> i64 {
    let Some(at) = program.find("mhlo.num_partitions = ") else { return 1 };
    program[at + "mhlo.num_partitions = ".len()..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: &str) -> CallSpec {
        CallSpec::from_json(json).unwrap()
    }

    #[test]
    fn array_types_round_trip_and_name_their_tensor() {
        let t: ArrayType = "bf16[1024,2048]".parse().unwrap();
        assert_eq!(t.tensor(), "tensor<1024x2048xbf16>");
        assert_eq!(t.to_string(), "bf16[1024,2048]");
        assert_eq!("i32[]".parse::<ArrayType>().unwrap().tensor(), "tensor<i32>");
        assert_eq!(
            "f8e4m3fn[8,128]".parse::<ArrayType>().unwrap().tensor(),
            "tensor<8x128xf8E4M3FN>"
        );
        assert!(
            "bf16[1,x]".parse::<ArrayType>().unwrap_err().contains("bad array type `bf16[1,x]`")
        );
        assert!("q7[1]".parse::<ArrayType>().unwrap_err().contains("unknown dtype `q7`"));
    }

    #[test]
    fn one_result_wraps_like_jax() {
        let s = spec(
            r#"{"inputs":["bf16[8,128]","bf16[8,128]"],"outputs":["bf16[8,128]"],"vmem_limit_bytes":null,"input_output_aliases":[],"name":"add"}"#,
        );
        let text = wrap("module {}", &s).unwrap();
        let body = base64::engine::general_purpose::STANDARD.encode("module {}");
        assert!(text.contains(&format!("backend_config = \"{{\\22custom_call_config\\22: {{\\22body\\22: \\22{body}\\22, \\22serialization_format\\22: 1, \\22needs_layout_passes\\22: true}}}}\"")), "{text}");
        assert!(
            text.contains("%0 = stablehlo.custom_call @tpu_custom_call(%arg0, %arg1)"),
            "{text}"
        );
        assert!(text.contains("operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[1, 0]> : tensor<2xindex>]"), "{text}");
        assert!(
            text.contains(": (tensor<8x128xbf16>, tensor<8x128xbf16>) -> tensor<8x128xbf16>"),
            "{text}"
        );
        assert!(text.contains("kernel_name = \"add\""));
        assert!(!text.contains("output_operand_aliases"));
    }

    #[test]
    fn several_results_aliases_and_vmem_limit() {
        let s = spec(
            r#"{"inputs":["i32[2]","f32[8,128]"],"outputs":["f32[8,128]","bf16[4]"],"vmem_limit_bytes":1048576,"input_output_aliases":[[1,0]],"name":"k"}"#,
        );
        let text = wrap("b", &s).unwrap();
        assert!(text.contains("%arg1: tensor<8x128xf32> {tf.aliasing_output = 0 : i32}"), "{text}");
        assert!(text.contains("output_operand_aliases = [#stablehlo.output_operand_alias<output_tuple_indices = [0], operand_index = 1, operand_tuple_indices = []>]"), "{text}");
        assert!(text.contains("%0:2 = stablehlo.custom_call"), "{text}");
        assert!(text.contains("return %0#0, %0#1 : tensor<8x128xf32>, tensor<4xbf16>"), "{text}");
        assert!(text.contains("\\22scoped_memory_configs\\22: [{\\22memory_space\\22:1, \\22offset\\22: 0, \\22size\\22: 1048576}]"), "{text}");
    }

    #[test]
    fn several_devices_wrap_like_shard_map() {
        let s = spec(
            r#"{"inputs":["bf16[16,128]"],"outputs":["bf16[64,128]"],"name":"all_gather","devices":4,"mesh":[["x",4]],"has_communication":true,"collective_id":0}"#,
        );
        let text = wrap("b", &s).unwrap();
        assert!(
            text.contains("mhlo.num_partitions = 4 : i32")
                && text.contains("sdy.mesh @mesh = <[\"x\"=4]>"),
            "{text}"
        );
        assert!(text.contains("@main(%arg0: tensor<64x128xbf16> {sdy.sharding = #sdy.sharding<@mesh, [{\"x\"}, {}]>}) -> tensor<256x128xbf16>"), "{text}");
        assert!(text.contains("manual_axes={\"x\"} (%local0: tensor<16x128xbf16>)"), "{text}");
        assert!(text.contains("stablehlo.custom_call @tpu_custom_call(%local0)"), "{text}");
        assert!(text.contains("\\22has_communication\\22: true, \\22collective_id\\22: 0, \\22serialization_format\\22: 1"), "{text}");
        assert_eq!(num_partitions(&text), 4);
        assert_eq!(num_partitions("module {}"), 1);
        // A cache updated in place: donated at the program's boundary, aliased in the call.
        let s = spec(
            r#"{"inputs":["i32[8]","bf16[16,128]"],"outputs":["f32[8,128]","bf16[16,128]"],"input_output_aliases":[[1,1]],"name":"k","devices":2,"mesh":[["x",2]],"has_communication":true,"collective_id":0}"#,
        );
        let text = wrap("b", &s).unwrap();
        assert!(text.contains("%arg1: tensor<32x128xbf16> {sdy.sharding = #sdy.sharding<@mesh, [{\"x\"}, {}]>, tf.aliasing_output = 1 : i32}"), "{text}");
        assert!(text.contains("output_operand_aliases = [#stablehlo.output_operand_alias<output_tuple_indices = [1], operand_index = 1, operand_tuple_indices = []>]"), "{text}");
        let e = CallSpec::from_json(
            r#"{"inputs":["f32[]"],"outputs":["f32[8]"],"name":"k","devices":2}"#,
        )
        .unwrap_err();
        assert!(e.contains("the scalar f32[] cannot be split over devices"), "{e}");
    }

    #[test]
    fn bad_specs_say_what_is_wrong() {
        assert!(
            CallSpec::from_json(r#"{"inputs":[],"outputs":[],"name":"k"}"#)
                .unwrap_err()
                .contains("no outputs")
        );
        let e = CallSpec::from_json(r#"{"inputs":["f32[8]"],"outputs":["f32[4]"],"input_output_aliases":[[0,0]],"name":"k"}"#).unwrap_err();
        assert!(e.contains("alias [0, 0] joins f32[8] and f32[4]"), "{e}");
        assert!(CallSpec::from_json(r#"{"inputs":["f32[8]"],"outputs":["f32[8]"],"input_output_aliases":[[3,0]],"name":"k"}"#).unwrap_err().contains("no such input"));
        assert!(
            CallSpec::from_json(r#"{"inputs":["f32[8"],"outputs":["f32[8]"],"name":"k"}"#)
                .unwrap_err()
                .contains("bad array type")
        );
    }
}
