//! `archplace space`: the candidate accelerators in visit order.

use super::{Exit, load_spec, thousands};
use anyhow::{Context, Result};
use archplace_engine::space::{Candidate, Space, enumerate};
use archplace_plugin_sdk::units::format_bytes;
use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Serialize)]
struct Row {
    tensor_cores: u32,
    vector_cores: u32,
    width: u32,
    depth: u32,
    vector_width: u32,
    buffer_bytes: u64,
    area_um2: f64,
    area_mm2: f64,
    bucket: u64,
}

impl From<&Candidate> for Row {
    fn from(c: &Candidate) -> Self {
        let k = &c.config;
        Row {
            tensor_cores: k.tensor_cores,
            vector_cores: k.vector_cores,
            width: k.width,
            depth: k.depth,
            vector_width: k.vector_width,
            buffer_bytes: k.buffer_bytes,
            area_um2: c.area_um2,
            area_mm2: c.area_um2 / 1e6,
            bucket: c.bucket,
        }
    }
}

#[derive(Serialize)]
pub struct Summary {
    pub summary: bool,
    pub candidates: usize,
    pub enumerated: usize,
    pub out_of_domain: usize,
    pub distinct_tensor_core_configs: usize,
    pub distinct_vector_core_configs: usize,
    pub area_buckets: usize,
    pub budget_mm2: f64,
    pub min_area_mm2: f64,
    pub smallest_mm2: Option<f64>,
    pub largest_mm2: Option<f64>,
    pub enumeration_seconds: f64,
}

pub fn summary(space: &Space, seconds: f64) -> Summary {
    let areas = space.candidates.iter().map(|c| c.area_um2 / 1e6);
    Summary {
        summary: true,
        candidates: space.candidates.len(),
        enumerated: space.enumerated,
        out_of_domain: space.out_of_domain,
        distinct_tensor_core_configs: space.tensor_core_configs.len(),
        distinct_vector_core_configs: space.vector_core_configs.len(),
        area_buckets: space.buckets,
        budget_mm2: space.budget_um2 / 1e6,
        min_area_mm2: space.min_area_um2 / 1e6,
        smallest_mm2: areas.clone().reduce(f64::min),
        largest_mm2: areas.reduce(f64::max),
        enumeration_seconds: seconds,
    }
}

/// How `space` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    /// One JSON document: `{"summary": {…}, "candidates": […]}`.
    Json,
    /// JSON Lines: one object per candidate, then the summary (`"summary": true`).
    JsonLines,
}

/// `archplace space`.
#[derive(Debug, clap::Args)]
pub struct SpaceArgs {
    /// Spec file; the embedded default spec when omitted.
    pub spec: Option<PathBuf>,
    /// One JSON document: `{"summary": {…}, "candidates": […]}`.
    #[arg(long, conflicts_with = "jsonl")]
    pub json: bool,
    /// JSON Lines, streamed: one object per candidate, then the summary.
    #[arg(long)]
    pub jsonl: bool,
    /// Print at most this many candidates (the summary covers all).
    #[arg(long)]
    pub limit: Option<usize>,
}

pub fn run(args: &SpaceArgs, plugins: &super::plugin::PluginArgs) -> Result<Exit> {
    let format = match (args.json, args.jsonl) {
        (true, _) => Format::Json,
        (_, true) => Format::JsonLines,
        _ => Format::Text,
    };
    let limit = args.limit;
    let spec = load_spec(args.spec.as_deref(), Some(plugins))?;
    let host = plugins.host()?;
    let models = super::cost_models(&spec, &host, Default::default())?;
    let start = Instant::now();
    let space = enumerate(&spec.space, models.area.as_ref())
        .context("enumerating the architecture space")?;
    let seconds = start.elapsed().as_secs_f64();
    let shown = limit.unwrap_or(usize::MAX);
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let s = summary(&space, seconds);
    if format == Format::JsonLines {
        for c in space.candidates.iter().take(shown) {
            serde_json::to_writer(&mut out, &Row::from(c))?;
            writeln!(out)?;
        }
        serde_json::to_writer(&mut out, &s)?;
        writeln!(out)?;
    } else if format == Format::Json {
        // Streamed: the whole space is not built in memory as one value.
        write!(out, "{{\"summary\":")?;
        serde_json::to_writer(&mut out, &s)?;
        write!(out, ",\"candidates\":[")?;
        for (i, c) in space.candidates.iter().take(shown).enumerate() {
            if i > 0 {
                write!(out, ",")?;
            }
            serde_json::to_writer(&mut out, &Row::from(c))?;
        }
        writeln!(out, "]}}")?;
    } else {
        writeln!(
            out,
            "{:>6} {:>6} {:>5} {:>5} {:>5} {:>9} {:>12} {:>9}",
            "TC", "VC", "width", "depth", "vw", "buffer", "area mm²", "bucket"
        )?;
        for c in space.candidates.iter().take(shown) {
            let k = &c.config;
            writeln!(
                out,
                "{:>6} {:>6} {:>5} {:>5} {:>5} {:>9} {:>12.3} {:>9}",
                k.tensor_cores,
                k.vector_cores,
                k.width,
                k.depth,
                k.vector_width,
                format_bytes(k.buffer_bytes),
                c.area_um2 / 1e6,
                c.bucket
            )?;
        }
        writeln!(
            out,
            "{} candidates of {} enumerated ({} outside the area model's domain); {} distinct tensor-core and {} vector-core configurations; {} area buckets",
            thousands(s.candidates as u64),
            thousands(s.enumerated as u64),
            s.out_of_domain,
            thousands(s.distinct_tensor_core_configs as u64),
            thousands(s.distinct_vector_core_configs as u64),
            thousands(s.area_buckets as u64)
        )?;
        writeln!(
            out,
            "area budget {:.3} mm², minimum {:.3} mm²; enumerated in {:.1} ms",
            s.budget_mm2,
            s.min_area_mm2,
            seconds * 1e3
        )?;
    }
    out.flush()?;
    Ok(Exit::Success)
}
