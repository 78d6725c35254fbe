//! Rewrites inside one layer, with egg: fold RMS-norm scales into the weights that consume
//! the normalised activations, and fuse projections that share an input into one matmul over
//! concatenated weights (q/k/v; the experts' gate/up). Extraction is DAG-aware: a fused
//! matmul shared by the `lo`/`hi` views of its output is paid once (a tree cost would pay it
//! per use and never fuse).
//!
//! Language (weights are symbols `w:NAME`; static parameters are children, tensat-style):
//! - activations: `(rmsnorm X W)`, `(rms X)` (unit scale), `(matmul X W)`, `(headnorm X W)`,
//!   `(rope X)`, `(attn Q K V)`, `(mla_attn Q KV_A NORM KV_B)` (multi-head latent attention
//!   with its latent norm's and `kv_b_proj`'s weights), `(add A B)`, `(silu_mul A B)`, `(topk LOGITS K)`,
//!   `(experts X TOPK GATE UP DOWN)`, `(experts_gu X TOPK GATE_UP DOWN)`, `(lo Y)` / `(hi Y)`
//!   (the column halves of a fused matmul's output), `(layer OUT)` (the root);
//! - host-side weight transforms (free at run time): `(fold S W)` = `diag(S) · W^T` (a norm
//!   scale folded into the input rows of a linear weight), `(cat A B)` (columns of A then B).
//!
//! Legality lives in [`WeightInfo`] (the e-class analysis): a weight class knows its leaf
//! weights and bytes, `merge` asserts equal bytes, and fusion only applies to disjoint
//! weight sets in their graph order.
//!
//! The extraction's result is what the plan builds from, not a check beside it: the
//! matmuls it keeps ([`Rewritten::matmuls`], typed [`FusedWeight`]s in dataflow order)
//! become the dense stream's segments, its experts' weights the expert chunks' layout
//! (`crate::plan`). Egg stays (rather than a plain pattern check) because which fusions
//! to take is a cost question the DAG-aware extraction answers for any layer graph (a fused
//! matmul pays only when every view of it is used), and a new fusable form (a dense MLP's
//! gate/up, several tokens' projections) is one more rule, not one more matcher.

use crate::graph::{Weight, WeightKind};
use egg::{
    Analysis, DidMerge, EGraph, Id, Language, MultiPattern, RecExpr, Rewrite, Runner,
    SearchMatches, StopReason, Symbol, define_language, rewrite as rw,
};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap};

define_language! {
    /// One decoder layer's dataflow.
    pub enum LayerLang {
        "layer" = Layer([Id; 1]),
        "rmsnorm" = RmsNorm([Id; 2]),
        "rms" = Rms(Id),
        "matmul" = Matmul([Id; 2]),
        "headnorm" = HeadNorm([Id; 2]),
        "rope" = Rope(Id),
        "attn" = Attn([Id; 3]),
        "mla_attn" = MlaAttn([Id; 4]),
        "add" = Add([Id; 2]),
        "silu_mul" = SiluMul([Id; 2]),
        "topk" = TopK([Id; 2]),
        "experts" = Experts([Id; 5]),
        "experts_gu" = ExpertsGu([Id; 4]),
        "fold" = Fold([Id; 2]),
        "cat" = Cat([Id; 2]),
        "lo" = Lo(Id),
        "hi" = Hi(Id),
        Symbol(Symbol),
    }
}

/// Facts about a weight-valued e-class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WInfo {
    /// The Hugging Face weights it is made of (by graph order).
    pub leaves: BTreeSet<usize>,
    /// HBM bytes streamed when a matmul reads it.
    pub bytes: u64,
}

/// The e-class analysis: weight facts, from a table of weight sizes.
#[derive(Debug, Default)]
pub struct WeightInfo {
    /// `w:NAME` → (graph order, bytes).
    pub weights: HashMap<Symbol, (usize, u64)>,
}

impl Analysis<LayerLang> for WeightInfo {
    type Data = Option<WInfo>;

    fn make(egraph: &mut EGraph<LayerLang, Self>, enode: &LayerLang, _id: Id) -> Self::Data {
        let d = |i: &Id| egraph[*i].data.clone();
        match enode {
            LayerLang::Symbol(s) => egraph
                .analysis
                .weights
                .get(s)
                .map(|&(order, bytes)| WInfo { leaves: [order].into(), bytes }),
            LayerLang::Fold([_, w]) => d(w),
            LayerLang::Cat([a, b]) => match (d(a), d(b)) {
                (Some(a), Some(b)) => Some(WInfo {
                    leaves: a.leaves.union(&b.leaves).copied().collect(),
                    bytes: a.bytes + b.bytes,
                }),
                _ => None,
            },
            _ => None,
        }
    }

    fn merge(&mut self, to: &mut Self::Data, from: Self::Data) -> DidMerge {
        match (to.as_ref(), from) {
            (Some(a), Some(b)) => {
                assert_eq!(a, &b, "merged weight classes with different contents");
                DidMerge(false, false)
            }
            (None, Some(b)) => {
                *to = Some(b);
                DidMerge(true, false)
            }
            (Some(_), None) => DidMerge(false, true),
            (None, None) => DidMerge(false, false),
        }
    }
}

/// The fusion multipattern with its legality check: `?a` and `?b` are disjoint weight sets
/// and every leaf of `?a` precedes every leaf of `?b` (so each set of weights fuses in one
/// order, graph order, and saturation terminates).
struct FuseProjections {
    applier: MultiPattern<LayerLang>,
}

impl egg::Applier<LayerLang, WeightInfo> for FuseProjections {
    fn apply_one(
        &self,
        _: &mut EGraph<LayerLang, WeightInfo>,
        _: Id,
        _: &egg::Subst,
        _: Option<&egg::PatternAst<LayerLang>>,
        _: Symbol,
    ) -> Vec<Id> {
        Vec::new()
    }

    fn apply_matches(
        &self,
        egraph: &mut EGraph<LayerLang, WeightInfo>,
        matches: &[SearchMatches<LayerLang>],
        rule: Symbol,
    ) -> Vec<Id> {
        let a: egg::Var = "?a".parse().expect("var");
        let b: egg::Var = "?b".parse().expect("var");
        let legal = |s: &egg::Subst| match (&egraph[s[a]].data, &egraph[s[b]].data) {
            (Some(x), Some(y)) => x.leaves.last() < y.leaves.first(),
            _ => false,
        };
        let kept: Vec<SearchMatches<LayerLang>> = matches
            .iter()
            .map(|m| SearchMatches {
                eclass: m.eclass,
                substs: m.substs.iter().filter(|s| legal(s)).cloned().collect(),
                ast: m.ast.clone(),
            })
            .filter(|m| !m.substs.is_empty())
            .collect();
        // A multipattern reports every application as a change; report only real ones so
        // the runner can see saturation.
        let before = (egraph.total_number_of_nodes(), egraph.number_of_classes());
        let ids = self.applier.apply_matches(egraph, &kept, rule);
        if (egraph.total_number_of_nodes(), egraph.number_of_classes()) == before {
            Vec::new()
        } else {
            ids
        }
    }
}

/// The rules.
pub fn rules() -> Vec<Rewrite<LayerLang, WeightInfo>> {
    let fuse_searcher: MultiPattern<LayerLang> =
        "?p = (matmul ?x ?a), ?q = (matmul ?x ?b)".parse().expect("pattern");
    let fuse_applier: MultiPattern<LayerLang> =
        "?p = (lo (matmul ?x (cat ?a ?b))), ?q = (hi (matmul ?x (cat ?a ?b)))"
            .parse()
            .expect("pattern");
    vec![
        rw!("fold-norm-into-matmul"; "(matmul (rmsnorm ?x ?s) ?w)" => "(matmul (rms ?x) (fold ?s ?w))"),
        rw!("fold-norm-into-experts"; "(experts (rmsnorm ?x ?s) ?t ?g ?u ?d)" => "(experts (rms ?x) ?t (fold ?s ?g) (fold ?s ?u) ?d)"),
        rw!("fuse-gate-up"; "(experts ?x ?t ?g ?u ?d)" => "(experts_gu ?x ?t (cat ?g ?u) ?d)"),
        rw!("fold-over-cat"; "(cat (fold ?s ?a) (fold ?s ?b))" => "(fold ?s (cat ?a ?b))"),
        Rewrite::new(
            "fuse-shared-input-matmuls",
            fuse_searcher,
            FuseProjections { applier: fuse_applier },
        )
        .expect("rule"),
    ]
}

/// Run-time cost of one e-node, in HBM-byte equivalents: weight bytes streamed plus a fixed
/// overhead per MXU op (a DMA issue, a pipeline fill and drain; ~0.35 µs ≈ 0.5 MB at HBM
/// speed) and per VPU pass over the activations. Host-side transforms are free.
fn node_cost(egraph: &EGraph<LayerLang, WeightInfo>, n: &LayerLang) -> u64 {
    const OP: u64 = 512 * 1024;
    const VPU: u64 = 16 * 1024;
    let bytes = |i: &Id| egraph[*i].data.as_ref().map_or(0, |w| w.bytes);
    match n {
        LayerLang::Matmul([_, w]) => OP + bytes(w),
        LayerLang::RmsNorm(_) => 2 * VPU,
        LayerLang::Rms(_)
        | LayerLang::HeadNorm(_)
        | LayerLang::Rope(_)
        | LayerLang::Add(_)
        | LayerLang::SiluMul(_)
        | LayerLang::TopK(_) => VPU,
        LayerLang::Attn(_) => OP,
        // The latent's norm and `kv_b_proj`, read by the attention itself.
        LayerLang::MlaAttn([_, _, norm, kv_b]) => OP + bytes(norm) + bytes(kv_b),
        LayerLang::Experts([_, _, g, u, d]) => 3 * OP + bytes(g) + bytes(u) + bytes(d),
        LayerLang::ExpertsGu([_, _, gu, d]) => 2 * OP + bytes(gu) + bytes(d),
        LayerLang::Layer(_)
        | LayerLang::Fold(_)
        | LayerLang::Cat(_)
        | LayerLang::Lo(_)
        | LayerLang::Hi(_)
        | LayerLang::Symbol(_) => 0,
    }
}

/// DAG cost of a choice (one node per class): the sum of node costs over the classes
/// reachable from `root`, each once; `None` if the choice has a cycle.
fn dag_cost(
    eg: &EGraph<LayerLang, WeightInfo>,
    root: Id,
    choice: &HashMap<Id, usize>,
) -> Option<u64> {
    let mut state: HashMap<Id, bool> = HashMap::new(); // false = on the stack, true = done
    let mut total = 0u64;
    fn visit(
        eg: &EGraph<LayerLang, WeightInfo>,
        c: Id,
        choice: &HashMap<Id, usize>,
        state: &mut HashMap<Id, bool>,
        total: &mut u64,
    ) -> Option<()> {
        let c = eg.find(c);
        match state.get(&c) {
            Some(true) => return Some(()),
            Some(false) => return None,
            None => {}
        }
        state.insert(c, false);
        let node = &eg[c].nodes[*choice.get(&c)?];
        for k in node.children() {
            visit(eg, *k, choice, state, total)?;
        }
        *total += node_cost(eg, node);
        state.insert(c, true);
        Some(())
    }
    visit(eg, root, choice, &mut state, &mut total)?;
    Some(total)
}

/// DAG-aware extraction: a greedy bottom-up pass whose class costs are sums over the *set*
/// of classes used (shared subterms count once), then a local search over single and pair
/// changes of choices, scored by the exact DAG cost of the whole expression. The pair moves
/// matter: fusing q and k pays off only when both switch to the views of the fused matmul.
fn extract_dag(egraph: &EGraph<LayerLang, WeightInfo>, root: Id) -> (u64, RecExpr<LayerLang>) {
    let root = egraph.find(root);
    let mut classes: Vec<Id> = egraph.classes().map(|c| c.id).collect();
    classes.sort();
    // Greedy start.
    let mut best: HashMap<Id, (u64, BTreeMap<Id, u64>)> = HashMap::new();
    let mut choice: HashMap<Id, usize> = HashMap::new();
    loop {
        let mut changed = false;
        for &c in &classes {
            for (ni, node) in egraph[c].nodes.iter().enumerate() {
                let kids = node.children();
                if kids.iter().any(|k| !best.contains_key(&egraph.find(*k))) {
                    continue;
                }
                let mut set: BTreeMap<Id, u64> = BTreeMap::new();
                for k in kids {
                    set.extend(best[&egraph.find(*k)].1.iter().map(|(a, b)| (*a, *b)));
                }
                if set.contains_key(&c) {
                    continue;
                }
                set.insert(c, node_cost(egraph, node));
                let total: u64 = set.values().sum();
                if best.get(&c).is_none_or(|b| total < b.0) {
                    best.insert(c, (total, set));
                    choice.insert(c, ni);
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
    }
    // Local search.
    let mut cost = dag_cost(egraph, root, &choice).unwrap_or(u64::MAX);
    let alts: Vec<Id> = classes.iter().copied().filter(|c| egraph[*c].nodes.len() > 1).collect();
    loop {
        let mut improved = false;
        for &c in &alts {
            for n in 0..egraph[c].nodes.len() {
                let mut next = choice.clone();
                next.insert(c, n);
                if let Some(t) = dag_cost(egraph, root, &next).filter(|t| *t < cost) {
                    (choice, cost, improved) = (next, t, true);
                }
            }
        }
        if !improved {
            'pairs: for (i, &c1) in alts.iter().enumerate() {
                for &c2 in &alts[i + 1..] {
                    for n1 in 0..egraph[c1].nodes.len() {
                        for n2 in 0..egraph[c2].nodes.len() {
                            let mut next = choice.clone();
                            next.insert(c1, n1);
                            next.insert(c2, n2);
                            if let Some(t) = dag_cost(egraph, root, &next).filter(|t| *t < cost) {
                                (choice, cost, improved) = (next, t, true);
                                break 'pairs;
                            }
                        }
                    }
                }
            }
        }
        if !improved {
            break;
        }
    }
    let mut expr = RecExpr::default();
    let mut memo: HashMap<Id, Id> = HashMap::new();
    fn build(
        c: Id,
        eg: &EGraph<LayerLang, WeightInfo>,
        choice: &HashMap<Id, usize>,
        expr: &mut RecExpr<LayerLang>,
        memo: &mut HashMap<Id, Id>,
    ) -> Id {
        let c = eg.find(c);
        if let Some(&i) = memo.get(&c) {
            return i;
        }
        let node =
            eg[c].nodes[choice[&c]].clone().map_children(|k| build(k, eg, choice, expr, memo));
        let i = expr.add(node);
        memo.insert(c, i);
        i
    }
    build(root, egraph, &choice, &mut expr, &mut memo);
    (cost, expr)
}

/// A matmul of the rewritten layer: the weights it reads (concatenated in this order along
/// the output dim) and the norm scale folded into them, if any.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FusedWeight {
    pub weights: Vec<Weight>,
    pub folded_scale: Option<Weight>,
}

impl FusedWeight {
    /// The kinds of its weights, in column order.
    pub fn kinds(&self) -> Vec<WeightKind> {
        self.weights.iter().map(|w| w.kind).collect()
    }

    /// The kind of the folded norm scale.
    pub fn folded_kind(&self) -> Option<WeightKind> {
        self.folded_scale.as_ref().map(|w| w.kind)
    }

    /// `[a | b] (folded s)`, as the report prints it.
    pub fn describe(&self) -> String {
        let fold =
            self.folded_scale.as_ref().map(|f| format!(" (folded {})", f.name)).unwrap_or_default();
        format!(
            "[{}]{fold}",
            self.weights.iter().map(|w| w.name.as_str()).collect::<Vec<_>>().join(" | ")
        )
    }
}

/// The outcome of rewriting one expression.
#[derive(Clone, Debug, Serialize)]
pub struct Rewritten {
    /// The extracted expression.
    pub expr: String,
    /// Why the runner stopped (`Saturated` expected).
    pub stop: String,
    pub iterations: usize,
    pub egraph_nodes: usize,
    /// DAG cost before and after (HBM-byte equivalents).
    pub cost_before: u64,
    pub cost_after: u64,
    /// Every matmul, in expression order (children before parents: dataflow order).
    pub matmuls: Vec<FusedWeight>,
    /// The experts' weights: `[gate_up, down]` when gate/up fused, else `[gate, up, down]`.
    pub experts: Vec<FusedWeight>,
}

impl Rewritten {
    pub fn saturated(&self) -> bool {
        self.stop == "Saturated"
    }
}

/// The weights under `id` (a symbol, `fold` or `cat` of them) into `out`, in column order;
/// symbols are looked up in `table` (every weight of the expression is in it).
fn weight_of(
    expr: &RecExpr<LayerLang>,
    id: Id,
    scale: Option<Weight>,
    table: &HashMap<Symbol, Weight>,
    out: &mut FusedWeight,
) {
    match &expr[id] {
        LayerLang::Fold([s, w]) => {
            let s = match &expr[*s] {
                LayerLang::Symbol(s) => table.get(s).cloned(),
                _ => None,
            };
            weight_of(expr, *w, s, table, out)
        }
        LayerLang::Cat([a, b]) => {
            weight_of(expr, *a, scale.clone(), table, out);
            weight_of(expr, *b, scale, table, out);
        }
        LayerLang::Symbol(s) => {
            out.weights.extend(table.get(s).cloned());
            if out.folded_scale.is_none() {
                out.folded_scale = scale;
            }
        }
        // Not a weight: no kind, so the plan's typed checks refuse the matmul.
        _ => {}
    }
}

/// Rewrite `expr` (from [`crate::graph::LayerGraph::to_expr`]) with [`rules`]; `weights`: every
/// weight of the expression (`w:NAME`) with its bytes, in graph order.
pub fn rewrite(expr: &str, weights: &[(Weight, u64)]) -> Rewritten {
    let start: RecExpr<LayerLang> =
        expr.parse().expect("the layer graph prints a valid expression");
    // Costs are sums of a few dozen weight sizes: capped at 2^48 bytes (far above any real
    // weight) they cannot overflow, and sizes that large rank the same anyway.
    let symbol = |w: &Weight| Symbol::from(format!("w:{}", w.name));
    let analysis = WeightInfo {
        weights: weights
            .iter()
            .enumerate()
            .map(|(i, (w, b))| (symbol(w), (i, (*b).min(1 << 48))))
            .collect(),
    };
    let table: HashMap<Symbol, Weight> =
        weights.iter().map(|(w, _)| (symbol(w), w.clone())).collect();
    let runner = Runner::<LayerLang, WeightInfo>::new(analysis)
        .with_iter_limit(30)
        .with_node_limit(10_000)
        .with_time_limit(std::time::Duration::from_secs(30))
        .with_scheduler(egg::SimpleScheduler)
        .with_expr(&start)
        .run(&rules());
    let stop = match runner.stop_reason.as_ref() {
        Some(StopReason::Saturated) => "Saturated".to_string(),
        Some(other) => format!("{other:?}"),
        None => "None".to_string(),
    };
    let root = runner.roots[0];
    let (cost_after, best) = extract_dag(&runner.egraph, root);
    // The starting expression's cost, extracted from an e-graph without rewrites.
    let mut plain = EGraph::new(WeightInfo { weights: runner.egraph.analysis.weights.clone() });
    let r0 = plain.add_expr(&start);
    plain.rebuild();
    let (cost_before, _) = extract_dag(&plain, r0);
    let mut matmuls = Vec::new();
    let mut experts = Vec::new();
    for node in best.as_ref() {
        match node {
            LayerLang::Matmul([_, w]) => {
                let mut f = FusedWeight { weights: Vec::new(), folded_scale: None };
                weight_of(&best, *w, None, &table, &mut f);
                matmuls.push(f);
            }
            LayerLang::ExpertsGu([_, _, gu, d]) | LayerLang::Experts([_, _, gu, _, d]) => {
                for w in [gu, d] {
                    let mut f = FusedWeight { weights: Vec::new(), folded_scale: None };
                    weight_of(&best, *w, None, &table, &mut f);
                    experts.push(f);
                }
                if let LayerLang::Experts([_, _, _, u, _]) = node {
                    let mut f = FusedWeight { weights: Vec::new(), folded_scale: None };
                    weight_of(&best, *u, None, &table, &mut f);
                    experts.insert(1, f);
                }
            }
            _ => {}
        }
    }
    Rewritten {
        expr: best.pretty(100),
        stop,
        iterations: runner.iterations.len(),
        egraph_nodes: runner.egraph.total_number_of_nodes(),
        cost_before,
        cost_after,
        matmuls,
        experts,
    }
}
