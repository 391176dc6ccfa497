//! `--bench`: llama-bench style measurements of a loaded bundle.
//!
//! Each test is prompt processing of `n_prompt` tokens (`ppN`) or generation of `n_gen`
//! tokens (`tgN`): one warm-up run, then `repetitions` timed runs from an empty cache.
//! Throughput is the mean ± sample standard deviation of the per-run tokens/s. Rows are
//! printed as each test ends, in one of llama-bench's formats, with its field names.

use crate::engine::{Engine, GenConfig, Next};
use crate::error::{Error, Result};
use crate::load::Loaded;
use serde::Serialize;
use std::io::Write;
use std::path::Path;

/// Output format (`-o`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Md,
    Csv,
    Json,
    Jsonl,
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Format, String> {
        match s {
            "md" => Ok(Format::Md),
            "csv" => Ok(Format::Csv),
            "json" => Ok(Format::Json),
            "jsonl" => Ok(Format::Jsonl),
            _ => Err(format!("{s:?} is not one of md, csv, json, jsonl")),
        }
    }
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Prompt lengths; 0 entries are skipped.
    pub n_prompt: Vec<usize>,
    /// Generation lengths; 0 entries are skipped.
    pub n_gen: Vec<usize>,
    pub repetitions: usize,
    pub allow_nonfinite: bool,
    pub cancel: crate::cancel::CancelToken,
    /// `--spec`: each generation test also runs with speculation, as a `tgN+<type>` row.
    pub spec: Option<crate::speculative::SpecConfig>,
}

/// Facts about the build and the loaded model that every row repeats.
#[derive(Debug, Clone, Serialize)]
pub struct RunInfo {
    pub build_commit: String,
    pub build_version: String,
    pub backends: String,
    pub model_filename: String,
    pub model_type: String,
    /// Bytes of the context binaries and the embedding table (a manifest's).
    pub model_size: u64,
    /// From the manifest's `model.n_params`; 0 when it does not say (and for Genie).
    pub model_n_params: u64,
    pub n_ctx: usize,
    pub io_type: String,
    pub io_mode: String,
    pub perf_mode: String,
    pub qnn_api: String,
    pub soc_model: Option<u32>,
    pub dsp_arch: Option<u32>,
}

impl RunInfo {
    /// Gather the facts of a loaded bundle (qhx manifest or Genie); `commit` and `version`
    /// name the build.
    pub fn new(loaded: &Loaded, zero_copy: bool, version: &str, commit: &str) -> RunInfo {
        let rt = loaded.rt();
        let about = &loaded.model().about;
        let mut seen: Vec<&Path> = Vec::new();
        let mut size = 0;
        for p in &about.files {
            if !seen.contains(&p.as_path()) {
                seen.push(p);
                size += std::fs::metadata(p).map_or(0, |md| md.len());
            }
        }
        let api = rt.backend().core_api;
        RunInfo {
            build_commit: commit.to_string(),
            build_version: version.to_string(),
            backends: backend_label(&rt.backend().provider_name, &rt.device_facts.build_id),
            model_filename: about.description.display().to_string(),
            model_type: about.model_type.clone(),
            model_size: size,
            model_n_params: about.n_params,
            n_ctx: loaded.max_ctx(),
            io_type: about.io_type.clone(),
            io_mode: if zero_copy { "rpcmem" } else { "client" }.to_string(),
            perf_mode: rt.perf_mode.as_str().to_string(),
            qnn_api: format!("{}.{}.{}", api.major, api.minor, api.patch),
            soc_model: rt.device_facts.soc_model,
            dsp_arch: rt.device_facts.dsp_arch,
        }
    }
}

/// The backend column: `QNN <provider>` (e.g. `QNN HTP_QTI_AISW`), except for qhx's CPU
/// emulator, which presents the HTP provider name but reports a `qnn-emu` build id.
pub fn backend_label(provider_name: &str, build_id: &str) -> String {
    if build_id.starts_with("qnn-emu") {
        "qnn-emu (CPU)".to_string()
    } else {
        format!("QNN {provider_name}")
    }
}

/// One finished test, with llama-bench's field names.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    #[serde(flatten)]
    pub info: RunInfo,
    pub n_prompt: usize,
    pub n_gen: usize,
    pub n_depth: usize,
    /// Start of the test, ISO 8601 UTC.
    pub test_time: String,
    pub avg_ns: u64,
    pub stddev_ns: u64,
    pub avg_ts: f64,
    pub stddev_ts: f64,
    pub samples_ns: Vec<u64>,
    pub samples_ts: Vec<f64>,
    /// The speculative row's draft type (`lookup`), empty for plain rows; its tokens per
    /// verify and graph executes per generated token (1 for plain rows), over the timed runs.
    pub spec_type: String,
    pub tokens_per_verify: f64,
    pub decode_executes_per_token: f64,
}

impl Row {
    /// `pp128`, `tg64`, `tg64+lookup`.
    pub fn test_name(&self) -> String {
        let t = test_name(self.n_prompt, self.n_gen);
        if self.spec_type.is_empty() {
            t
        } else {
            format!("{t}+{}", self.spec_type)
        }
    }
}

fn test_name(n_prompt: usize, n_gen: usize) -> String {
    if n_gen == 0 {
        format!("pp{n_prompt}")
    } else {
        format!("tg{n_gen}")
    }
}

/// Mean and sample standard deviation.
pub fn mean_sd(v: &[f64]) -> (f64, f64) {
    let n = v.len().max(1) as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = if v.len() > 1 {
        v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (v.len() - 1) as f64
    } else {
        0.0
    };
    (mean, var.sqrt())
}

/// The tests to run, in order, as (n_prompt, n_gen); zero sizes are skipped and sizes are
/// clamped to what the context holds (returned as warnings).
pub fn plan(cfg: &BenchConfig, max_ctx: usize) -> (Vec<(usize, usize)>, Vec<String>) {
    let mut tests = Vec::new();
    let mut warnings = Vec::new();
    let room = max_ctx.saturating_sub(1).max(1);
    let mut clamp = |n: usize, what: &str| {
        if n > room {
            warnings.push(format!("{what} {n} clamped to {room} (max_ctx {max_ctx})"));
        }
        n.min(room)
    };
    for &p in cfg.n_prompt.iter().filter(|&&p| p > 0) {
        tests.push((clamp(p, "n_prompt"), 0));
    }
    for &g in cfg.n_gen.iter().filter(|&&g| g > 0) {
        tests.push((0, clamp(g, "n_gen")));
    }
    (tests, warnings)
}

/// A fixed, deterministic prompt of `n` ids inside the vocabulary (benchmarks time the
/// graphs, not the text).
fn bench_ids(n: usize, vocab: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i as u64 * 7919 + 1) % vocab.max(1) as u64) as u32)
        .collect()
}

/// Time one run: prefill of `ids` (pp) or `n_gen` decode steps after one token (tg), with
/// speculation when `spec` is given (its counts are returned too).
fn time_once(
    engine: &mut Engine,
    cfg: &BenchConfig,
    ids: &[u32],
    n_gen: usize,
    spec: Option<&crate::speculative::SpecConfig>,
) -> Result<(u64, Option<crate::speculative::SpecStats>)> {
    engine.reset();
    let gen = GenConfig {
        ignore_eos: true,
        allow_nonfinite: cfg.allow_nonfinite,
        cancel: cfg.cancel.clone(),
        spec: spec.cloned(),
        ..GenConfig::greedy(n_gen + 1)
    };
    let o = engine.generate(ids, &gen, 0.0, |_| Ok(Next::Continue))?;
    if !cfg.cancel.is_cancelled() && o.output_ids.len() != n_gen + 1 {
        return Err(Error::graph(
            "bench",
            format!(
                "generated {} of {} tokens ({})",
                o.output_ids.len(),
                n_gen + 1,
                o.finish.as_str()
            ),
        ));
    }
    let ms = if n_gen == 0 {
        o.stats.prefill_ms
    } else {
        o.stats.decode_ms
    };
    Ok(((ms * 1e6).round() as u64, o.spec))
}

/// Run every test of `cfg`, printing each row as it ends. Returns the rows (fewer when
/// cancelled).
pub fn run(
    engine: &mut Engine,
    cfg: &BenchConfig,
    info: &RunInfo,
    tests: &[(usize, usize)],
    vocab: usize,
    printer: &mut Printer<'_>,
) -> Result<Vec<Row>> {
    printer.spec_suffix = cfg.spec.as_ref().map_or(0, |s| s.kind.as_str().len() + 1);
    printer.header(info, tests)?;
    let mut rows = Vec::new();
    // Each generation test once plain and, with --spec, once speculative.
    let runs: Vec<(usize, usize, Option<&crate::speculative::SpecConfig>)> = tests
        .iter()
        .flat_map(|&(p, g)| {
            let spec = cfg.spec.as_ref().filter(|_| g > 0);
            std::iter::once((p, g, None)).chain(spec.map(|s| (p, g, Some(s))))
        })
        .collect();
    for (n_prompt, n_gen, spec) in runs {
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let ids = bench_ids(n_prompt.max(1), vocab);
        time_once(engine, cfg, &ids, n_gen, spec)?; // warm-up
        let mut samples_ns = Vec::new();
        let (mut verifies, mut verify_tokens, mut executes, mut tokens) = (0, 0.0, 0.0, 0.0);
        for _ in 0..cfg.repetitions.max(1) {
            if cfg.cancel.is_cancelled() {
                break;
            }
            let (ns, st) = time_once(engine, cfg, &ids, n_gen, spec)?;
            samples_ns.push(ns);
            if let Some(st) = st {
                verifies += st.verifies;
                // The run's own counts, not its rounded ratios.
                verify_tokens += st.verify_tokens as f64;
                tokens += (st.verify_tokens + st.plain) as f64;
                executes += (st.verifies + st.plain) as f64;
            }
        }
        if cfg.cancel.is_cancelled() {
            break;
        }
        let n = (n_prompt + n_gen) as f64;
        let samples_ts: Vec<f64> = samples_ns
            .iter()
            .map(|&ns| if ns > 0 { n * 1e9 / ns as f64 } else { 0.0 })
            .collect();
        let ns: Vec<f64> = samples_ns.iter().map(|&x| x as f64).collect();
        let (avg_ns, sd_ns) = mean_sd(&ns);
        let (avg_ts, stddev_ts) = mean_sd(&samples_ts);
        let row = Row {
            info: info.clone(),
            n_prompt,
            n_gen,
            n_depth: 0,
            test_time: crate::chat::strftime("%Y-%m-%dT%H:%M:%SZ", started),
            avg_ns: avg_ns.round() as u64,
            stddev_ns: sd_ns.round() as u64,
            avg_ts,
            stddev_ts,
            samples_ns,
            samples_ts,
            spec_type: spec.map_or(String::new(), |s| s.kind.as_str().to_string()),
            tokens_per_verify: if verifies > 0 {
                verify_tokens / verifies as f64
            } else {
                0.0
            },
            decode_executes_per_token: if tokens > 0.0 { executes / tokens } else { 1.0 },
        };
        printer.row(&row)?;
        rows.push(row);
    }
    printer.footer(info)?;
    Ok(rows)
}

/// Column of the markdown table: header, right-aligned, width.
struct Col {
    name: &'static str,
    right: bool,
    width: usize,
}

/// Prints rows in one format as they arrive.
pub struct Printer<'w> {
    format: Format,
    out: &'w mut dyn Write,
    cols: Vec<Col>,
    rows: usize,
    /// Width of a speculative row's `+type` test-name suffix (0 without --spec).
    spec_suffix: usize,
}

/// "256.00 MiB" / "1.20 GiB".
pub fn human_size(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= 1024.0 * 1024.0 * 1024.0 {
        format!("{:.2} GiB", b / (1024.0 * 1024.0 * 1024.0))
    } else {
        format!("{:.2} MiB", b / (1024.0 * 1024.0))
    }
}

/// "134.52 M" / "1.24 B"; "?" when unknown.
pub fn human_params(n: u64) -> String {
    match n {
        0 => "?".into(),
        n if n >= 1_000_000_000 => format!("{:.2} B", n as f64 / 1e9),
        n => format!("{:.2} M", n as f64 / 1e6),
    }
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

impl<'w> Printer<'w> {
    pub fn new(format: Format, out: &'w mut dyn Write) -> Printer<'w> {
        Printer {
            format,
            out,
            cols: Vec::new(),
            rows: 0,
            spec_suffix: 0,
        }
    }

    fn io(e: std::io::Error) -> Error {
        Error::io("<stdout>", e)
    }

    fn md_cells(info: &RunInfo, test: &str, ts: &str) -> [String; 7] {
        [
            info.model_type.clone(),
            human_size(info.model_size),
            human_params(info.model_n_params),
            info.backends.clone(),
            format!("{} {}", info.io_type, info.io_mode),
            test.to_string(),
            ts.to_string(),
        ]
    }

    fn md_line(&mut self, cells: &[String]) -> Result<()> {
        let mut line = String::from("|");
        for (c, v) in self.cols.iter().zip(cells) {
            if c.right {
                line.push_str(&format!(" {v:>w$} |", w = c.width));
            } else {
                line.push_str(&format!(" {v:<w$} |", w = c.width));
            }
        }
        writeln!(self.out, "{line}").map_err(Self::io)
    }

    /// The header (md: the padded table head, sized for every row to come; csv: the field
    /// names; json: the opening bracket).
    pub fn header(&mut self, info: &RunInfo, tests: &[(usize, usize)]) -> Result<()> {
        match self.format {
            Format::Md => {
                let names = ["model", "size", "params", "backend", "I/O", "test", "t/s"];
                let right = [false, true, true, false, false, true, true];
                let spec_w = self.spec_suffix;
                let test_w = tests
                    .iter()
                    .map(|&(p, g)| test_name(p, g).len() + if g > 0 { spec_w } else { 0 })
                    .max()
                    .unwrap_or(0);
                let cells = Self::md_cells(info, &"x".repeat(test_w), &"x".repeat(20));
                self.cols = names
                    .iter()
                    .zip(right)
                    .zip(&cells)
                    .map(|((&name, right), v)| Col {
                        name,
                        right,
                        width: name.chars().count().max(v.chars().count()),
                    })
                    .collect();
                let head: Vec<String> = self.cols.iter().map(|c| c.name.to_string()).collect();
                self.md_line(&head)?;
                let mut rule = String::from("|");
                for c in &self.cols {
                    let dashes = "-".repeat(c.width);
                    if c.right {
                        rule.push_str(&format!(" {}: |", &dashes[1..]));
                    } else {
                        rule.push_str(&format!(" {dashes} |"));
                    }
                }
                writeln!(self.out, "{rule}").map_err(Self::io)?;
            }
            Format::Csv => {
                let v = serde_json::to_value(Row {
                    info: info.clone(),
                    n_prompt: 0,
                    n_gen: 0,
                    n_depth: 0,
                    test_time: String::new(),
                    avg_ns: 0,
                    stddev_ns: 0,
                    avg_ts: 0.0,
                    stddev_ts: 0.0,
                    samples_ns: Vec::new(),
                    samples_ts: Vec::new(),
                    spec_type: String::new(),
                    tokens_per_verify: 0.0,
                    decode_executes_per_token: 1.0,
                })
                .map_err(|e| Error::graph("bench", e.to_string()))?;
                let keys: Vec<&str> = v
                    .as_object()
                    .map(|o| o.keys().map(String::as_str).collect())
                    .unwrap_or_default();
                writeln!(self.out, "{}", keys.join(",")).map_err(Self::io)?;
            }
            Format::Json => writeln!(self.out, "[").map_err(Self::io)?,
            Format::Jsonl => {}
        }
        self.out.flush().map_err(Self::io)
    }

    pub fn row(&mut self, row: &Row) -> Result<()> {
        let v = serde_json::to_value(row).map_err(|e| Error::graph("bench", e.to_string()))?;
        match self.format {
            Format::Md => {
                let ts = format!("{:.2} ± {:.2}", row.avg_ts, row.stddev_ts);
                let cells = Self::md_cells(&row.info, &row.test_name(), &ts);
                self.md_line(&cells)?;
            }
            Format::Csv => {
                let fields: Vec<String> = v
                    .as_object()
                    .into_iter()
                    .flat_map(|o| o.values())
                    .map(|x| match x {
                        serde_json::Value::String(s) => csv_field(s),
                        serde_json::Value::Null => String::new(),
                        serde_json::Value::Array(a) => csv_field(
                            &a.iter()
                                .map(|e| e.to_string())
                                .collect::<Vec<_>>()
                                .join(" "),
                        ),
                        other => other.to_string(),
                    })
                    .collect();
                writeln!(self.out, "{}", fields.join(",")).map_err(Self::io)?;
            }
            Format::Json => {
                let sep = if self.rows == 0 { "" } else { ",\n" };
                write!(self.out, "{sep}  {v}").map_err(Self::io)?;
            }
            Format::Jsonl => writeln!(self.out, "{v}").map_err(Self::io)?,
        }
        self.rows += 1;
        self.out.flush().map_err(Self::io)
    }

    pub fn footer(&mut self, info: &RunInfo) -> Result<()> {
        match self.format {
            Format::Md => writeln!(
                self.out,
                "\nbuild: qhx {} ({})",
                info.build_version, info.build_commit
            )
            .map_err(Self::io)?,
            Format::Json => {
                let nl = if self.rows == 0 { "" } else { "\n" };
                writeln!(self.out, "{nl}]").map_err(Self::io)?
            }
            Format::Csv | Format::Jsonl => {}
        }
        self.out.flush().map_err(Self::io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_and_sample_sd() {
        let (m, s) = mean_sd(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert_eq!(m, 5.0);
        assert!((s - 2.138).abs() < 1e-3, "{s}");
        assert_eq!(mean_sd(&[3.0]), (3.0, 0.0));
    }

    #[test]
    fn zero_sizes_are_skipped_and_large_ones_clamped() {
        let cfg = BenchConfig {
            n_prompt: vec![0, 32, 500],
            n_gen: vec![16, 0],
            repetitions: 1,
            allow_nonfinite: false,
            cancel: Default::default(),
            spec: None,
        };
        let (t, w) = plan(&cfg, 128);
        assert_eq!(t, vec![(32, 0), (127, 0), (0, 16)]);
        assert_eq!(w.len(), 1, "{w:?}");
    }

    #[test]
    fn sizes_read_like_llama_bench() {
        assert_eq!(human_size(256 * 1024 * 1024), "256.00 MiB");
        assert_eq!(human_params(134_515_008), "134.52 M");
        assert_eq!(human_params(0), "?");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
    }

    #[test]
    fn the_emulator_is_named_in_the_backend_column() {
        assert_eq!(
            backend_label("HTP_QTI_AISW", "qnn-emu v0.1.0 (CPU emulator)"),
            "qnn-emu (CPU)"
        );
        assert_eq!(
            backend_label("HTP_QTI_AISW", "v2.43.0.250915134538_123456"),
            "QNN HTP_QTI_AISW"
        );
        assert_eq!(backend_label("HTP_QTI_AISW", ""), "QNN HTP_QTI_AISW");
    }
}
