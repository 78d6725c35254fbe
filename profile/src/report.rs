//! What `palladium profile` writes: a Chrome trace-event JSON (loads in Perfetto and
//! `chrome://tracing`), an SVG timeline and the summary (text and JSON).

use crate::cost::Unit;
use crate::dma::Resource;
use crate::{Timeline, Wait};
use indexmap::IndexMap;
use serde_json::{Value as Json, json};
use std::fmt::Write;

const CORE_PID: u32 = 1;
const DMA_PID: u32 = 2;

/// The trace: compute and waits on the core's two threads, one thread per concurrent DMA
/// lane (a transfer takes the first lane free at its issue, so events on a thread never
/// overlap), and the outermost loop's iterations as a third core thread. Times in
/// microseconds at the chip's clock.
pub fn trace_json(t: &Timeline) -> Json {
    let us = |c: f64| t.micros(c);
    let mut events = vec![
        json!({"ph": "M", "name": "process_name", "pid": CORE_PID, "tid": 0, "args": {"name": format!("{} core ({})", t.kernel, t.chip)}}),
        json!({"ph": "M", "name": "process_name", "pid": DMA_PID, "tid": 0, "args": {"name": "DMAs"}}),
        json!({"ph": "M", "name": "thread_name", "pid": CORE_PID, "tid": 1, "args": {"name": "compute"}}),
        json!({"ph": "M", "name": "thread_name", "pid": CORE_PID, "tid": 2, "args": {"name": "waits (bubbles)"}}),
        json!({"ph": "M", "name": "thread_name", "pid": CORE_PID, "tid": 3, "args": {"name": "sections"}}),
    ];
    for s in &t.compute {
        let units: IndexMap<&str, f64> = Unit::ALL
            .iter()
            .zip(s.units)
            .filter(|(_, c)| *c > 0.0)
            .map(|(u, c)| (u.name(), c))
            .collect();
        events.push(json!({"ph": "X", "name": s.dominant().name(), "cat": "compute", "pid": CORE_PID, "tid": 1, "ts": us(s.start), "dur": us(s.end - s.start),
            "args": {"cycles": units, "at": s.loc, "context": s.context}}));
    }
    for w in &t.waits {
        let d = &t.dmas[w.dma];
        events.push(json!({"ph": "X", "name": format!("wait {}", d.src), "cat": "bubble", "pid": CORE_PID, "tid": 2, "ts": us(w.start), "dur": us(w.end - w.start),
            "args": {"cycles": w.end - w.start, "cause": cause(t, w), "at": w.loc, "context": w.context}}));
    }
    for s in &t.sections {
        events.push(json!({"ph": "X", "name": s.label, "cat": "section", "pid": CORE_PID, "tid": 3, "ts": us(s.start), "dur": us(s.end - s.start)}));
    }
    let mut lanes: Vec<f64> = Vec::new();
    for d in &t.dmas {
        let lane = match lanes.iter().position(|&free| free <= d.issued) {
            Some(i) => i,
            None => {
                lanes.push(0.0);
                lanes.len() - 1
            }
        };
        lanes[lane] = d.done;
        events.push(json!({"ph": "X", "name": format!("{} -> {}", d.src, d.dst), "cat": match d.resource { Resource::Hbm => "hbm", Resource::Local => "local", Resource::Link(_) => "ici" },
            "pid": DMA_PID, "tid": lane + 1, "ts": us(d.issued), "dur": us(d.done - d.issued), "args": {"bytes": d.bytes, "at": d.loc, "context": d.context}}));
    }
    for i in 0..lanes.len() {
        events.push(json!({"ph": "M", "name": "thread_name", "pid": DMA_PID, "tid": i + 1, "args": {"name": format!("lane {i}")}}));
    }
    json!({"traceEvents": events, "displayTimeUnit": "ns", "otherData": {"kernel": t.kernel, "chip": t.chip.name(), "clock_hz": t.clock_hz, "cycles": t.cycles}})
}

fn cause(t: &Timeline, w: &Wait) -> String {
    let d = &t.dmas[w.dma];
    format!(
        "{} -> {} ({} bytes, started at {}{})",
        d.src,
        d.dst,
        d.bytes,
        d.loc,
        if d.context.is_empty() { String::new() } else { format!(" in {}", d.context) }
    )
}

/// Bubbles grouped by the transfer that ended them (source -> destination) and the wait;
/// those a remote copy or signal ended are named collective bubbles.
fn bubbles_by_cause(t: &Timeline) -> Vec<(String, u64, f64)> {
    let mut by: IndexMap<String, (u64, f64)> = IndexMap::new();
    for w in &t.waits {
        let d = &t.dmas[w.dma];
        let kind = if d.is_remote() { "collective: " } else { "" };
        let e = by.entry(format!("{kind}{} -> {} (wait at {})", d.src, d.dst, w.loc)).or_default();
        e.0 += 1;
        e.1 += w.end - w.start;
    }
    let mut v: Vec<(String, u64, f64)> = by.into_iter().map(|(k, (n, c))| (k, n, c)).collect();
    v.sort_by(|a, b| b.2.total_cmp(&a.2).then_with(|| a.0.cmp(&b.0)));
    v
}

fn largest_bubbles(t: &Timeline, n: usize) -> Vec<&Wait> {
    let mut w: Vec<&Wait> = t.waits.iter().collect();
    w.sort_by(|a, b| {
        (b.end - b.start).total_cmp(&(a.end - a.start)).then(a.start.total_cmp(&b.start))
    });
    w.truncate(n);
    w
}

/// Bubble cycles ended by local transfers (HBM, on-chip) and by remote ones (collectives).
fn bubble_split(t: &Timeline) -> (f64, f64) {
    let (mut local, mut remote) = (0.0, 0.0);
    for w in &t.waits {
        *(if t.dmas[w.dma].is_remote() { &mut remote } else { &mut local }) += w.end - w.start;
    }
    (local, remote)
}

fn busy(t: &Timeline) -> [f64; 6] {
    let mut u = [0.0; 6];
    for s in &t.compute {
        for (a, b) in u.iter_mut().zip(s.units) {
            *a += b;
        }
    }
    u
}

/// The summary as JSON (`summary.json`).
pub fn summary_json(t: &Timeline) -> Json {
    let bubble_cycles: f64 = t.waits.iter().map(|w| w.end - w.start).sum();
    let (local_bubbles, collective_bubbles) = bubble_split(t);
    let links = t.links.as_ref().map(|l| {
        json!({"devices": l.devices, "profiled_device": 0, "hop_latency_cycles": l.hop_latency_cycles, "source": l.source, "ici_bytes_sent": t.ici_bytes(), "collective_cycles": t.collective_cycles(), "planner_collective_cycles": l.planner_collective_cycles,
            "note": "a model: libtpu's static estimate prices remote DMAs at 0 cycles"})
    });
    json!({
        "kernel": t.kernel,
        "chip": t.chip.name(),
        "devices": links,
        "cycles": t.cycles,
        "microseconds": t.micros(t.cycles),
        "clock_hz": t.clock_hz,
        "hbm_bytes": t.hbm_bytes(),
        "hbm_bytes_per_cycle": t.hbm_bytes_per_cycle,
        "hbm_efficiency": t.hbm_efficiency(),
        "dmas": t.dmas.len(),
        "busy_cycles": Unit::ALL.iter().zip(busy(t)).map(|(u, c)| (u.name().to_string(), json!(c))).collect::<serde_json::Map<_, _>>(),
        "hbm_stream_cycles": t.hbm_stream_cycles(),
        "bubble_cycles": bubble_cycles,
        "bubble_cycles_hbm_and_local": local_bubbles,
        "bubble_cycles_collective": collective_bubbles,
        "bubbles_by_cause": bubbles_by_cause(t).iter().map(|(c, n, cy)| json!({"cause": c, "count": n, "cycles": cy})).collect::<Vec<_>>(),
        "largest_bubbles": largest_bubbles(t, 3).iter().map(|w| json!({"start_cycle": w.start, "cycles": w.end - w.start, "cause": cause(t, w), "wait_at": w.loc, "context": w.context})).collect::<Vec<_>>(),
        "assumptions": t.assumptions.iter().map(|(a, n)| json!({"assumption": a, "times": n})).collect::<Vec<_>>(),
    })
}

/// The summary for people (stdout).
pub fn summary_text(t: &Timeline) -> String {
    let mut s = String::new();
    let bubble_cycles: f64 = t.waits.iter().map(|w| w.end - w.start).sum();
    let _ = writeln!(
        s,
        "profile: {} on {} (model: DMAs share {:.1} HBM bytes/cycle, compute per op; calibrated against libtpu's estimates)",
        t.kernel, t.chip, t.hbm_bytes_per_cycle
    );
    let _ = writeln!(
        s,
        "  step time        {:.0} cycles ({:.1} us at {:.2} GHz)",
        t.cycles,
        t.micros(t.cycles),
        t.clock_hz / 1e9
    );
    let _ = writeln!(
        s,
        "  HBM              {:.3} GB in {} DMAs; efficiency {:.3} (bytes / bandwidth / step time)",
        t.hbm_bytes() as f64 / 1e9,
        t.dmas.len(),
        t.hbm_efficiency()
    );
    let b = busy(t);
    let units: Vec<String> = Unit::ALL
        .iter()
        .zip(b)
        .filter(|(_, c)| *c > 0.0)
        .map(|(u, c)| format!("{} {:.0}", u.name(), c))
        .collect();
    let _ = writeln!(
        s,
        "  core busy        {:.0} cycles; per unit (they overlap): {}",
        t.compute.iter().map(|c| c.end - c.start).sum::<f64>(),
        units.join(", ")
    );
    let _ = writeln!(
        s,
        "  HBM stream       {:.0} cycles (bytes / bandwidth: the step's floor)",
        t.hbm_stream_cycles()
    );
    if let Some(l) = &t.links {
        let _ = writeln!(
            s,
            "  collectives      {:.0} cycles with a remote copy or signal in flight; {:.3} MB sent over ICI (device 0 of {}, SPMD symmetry; links: {}, hop latency {:.0} cycles; a model: libtpu prices remote DMAs at 0 cycles)",
            t.collective_cycles(),
            t.ici_bytes() as f64 / 1e6,
            l.devices,
            l.source,
            l.hop_latency_cycles
        );
        if let Some(p) = l.planner_collective_cycles {
            let _ = writeln!(
                s,
                "  planner          {p:.0} cycles of collectives per step modelled by the planner (both ring directions at once, unpadded rows, one latency per collective); the timeline's {:.0} / the planner's = {:.2}",
                t.collective_cycles(),
                t.collective_cycles() / p
            );
        }
    }
    let (local, collective) = bubble_split(t);
    let _ = writeln!(
        s,
        "  bubbles          {:.0} cycles ({:.1}% of the step) in {} waits: {:.0} on HBM or on-chip copies, {:.0} on collectives",
        bubble_cycles,
        100.0 * bubble_cycles / t.cycles,
        t.waits.len(),
        local,
        collective
    );
    let _ = writeln!(s, "bubbles by cause:");
    for (c, n, cy) in bubbles_by_cause(t).iter().take(12) {
        let _ = writeln!(s, "  {cy:>12.0} cycles {n:>6} waits  {c}");
    }
    let _ = writeln!(s, "largest bubbles:");
    for (i, w) in largest_bubbles(t, 3).iter().enumerate() {
        let _ = writeln!(
            s,
            "  {}. {:.0} cycles at cycle {:.0} (wait at {}{}): {}",
            i + 1,
            w.end - w.start,
            w.start,
            w.loc,
            if w.context.is_empty() { String::new() } else { format!(", {}", w.context) },
            cause(t, w)
        );
    }
    if !t.assumptions.is_empty() {
        let _ = writeln!(s, "assumptions:");
        for (a, n) in &t.assumptions {
            let _ = writeln!(s, "  {a} ({n} times)");
        }
    }
    s
}

/// One SVG row: intervals merged where they are closer than a pixel.
fn row(svg: &mut String, y: f64, h: f64, scale: f64, mut spans: Vec<(f64, f64, &str)>) {
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut cur: Option<(f64, f64, &str)> = None;
    let emit = |svg: &mut String, (a, b, color): (f64, f64, &str)| {
        let _ = writeln!(
            svg,
            r#"<rect x="{:.2}" y="{y:.1}" width="{:.2}" height="{h:.1}" fill="{color}"/>"#,
            160.0 + a * scale,
            ((b - a) * scale).max(0.5)
        );
    };
    for sp in spans {
        cur = match cur {
            Some(c) if c.2 == sp.2 && (sp.0 - c.1) * scale < 1.0 => Some((c.0, c.1.max(sp.1), c.2)),
            Some(c) => {
                emit(svg, c);
                Some(sp)
            }
            None => Some(sp),
        };
    }
    if let Some(c) = cur {
        emit(svg, c);
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

const PALETTE: [&str; 8] =
    ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#bab0ac"];

/// The SVG timeline: HBM occupancy (one row per DMA source, colored by it), compute by
/// dominant unit, waits, and the sections (grid steps or the outermost loop's iterations).
pub fn svg(t: &Timeline) -> String {
    let width = 1600.0;
    let scale = width / t.cycles.max(1.0);
    let mut sources: IndexMap<String, Vec<(f64, f64, &str)>> = IndexMap::new();
    for d in &t.dmas {
        let name = if d.is_remote() {
            format!("ICI {}", d.src)
        } else if d.src == "window" {
            d.dst.clone()
        } else {
            d.src.clone()
        };
        sources.entry(name).or_default().push((d.issued, d.done, ""));
    }
    let colors: Vec<&str> = (0..sources.len()).map(|i| PALETTE[i % PALETTE.len()]).collect();
    let rows = sources.len() + 3;
    let height = 60.0 + rows as f64 * 26.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{height}" font-family="sans-serif" font-size="11">"#,
        width + 180.0
    );
    let _ = writeln!(
        s,
        r#"<text x="4" y="16">{}</text>"#,
        escape(&format!(
            "{} on {}: {:.0} cycles ({:.1} us), HBM efficiency {:.3}, bubbles {:.0} cycles",
            t.kernel,
            t.chip,
            t.cycles,
            t.micros(t.cycles),
            t.hbm_efficiency(),
            t.waits.iter().map(|w| w.end - w.start).sum::<f64>()
        ))
    );
    let mut y = 30.0;
    let label = |s: &mut String, y: f64, text: &str| {
        let _ = writeln!(s, r#"<text x="4" y="{:.1}">{}</text>"#, y + 13.0, escape(text));
    };
    for (i, (name, spans)) in sources.iter().enumerate() {
        label(&mut s, y, &format!("DMA {name}"));
        row(&mut s, y, 18.0, scale, spans.iter().map(|&(a, b, _)| (a, b, colors[i])).collect());
        y += 26.0;
    }
    label(&mut s, y, "compute");
    let unit_color = |u: Unit| match u {
        Unit::Mxu => "#e15759",
        Unit::Vpu => "#59a14f",
        Unit::Eup => "#b07aa1",
        Unit::Xlu => "#76b7b2",
        Unit::LoadStore => "#edc948",
        Unit::Scalar => "#9c755f",
    };
    row(
        &mut s,
        y,
        18.0,
        scale,
        t.compute.iter().map(|c| (c.start, c.end, unit_color(c.dominant()))).collect(),
    );
    y += 26.0;
    label(&mut s, y, "waits (bubbles)");
    row(&mut s, y, 18.0, scale, t.waits.iter().map(|w| (w.start, w.end, "#d62728")).collect());
    y += 26.0;
    label(&mut s, y, "sections");
    for (i, sec) in t.sections.iter().enumerate() {
        let _ = writeln!(
            s,
            r#"<rect x="{:.2}" y="{y:.1}" width="{:.2}" height="18" fill="{}" stroke="white" stroke-width="0.5"><title>{}</title></rect>"#,
            160.0 + sec.start * scale,
            ((sec.end - sec.start) * scale).max(0.5),
            if i % 2 == 0 { "#cfcfcf" } else { "#a0a0a0" },
            escape(&sec.label)
        );
    }
    let _ = writeln!(s, "</svg>");
    s
}
