//! Command-line parts shared by the binaries: argument groups (flag names follow
//! llama.cpp), usage errors (exit 2), the error line and exit code, `--version`.

use crate::sampler::SamplerConfig;

pub mod generate;
pub mod report;

/// `--version`: the crate version, the commit it was built from, and the QNN API versions
/// the loader accepts (major equal, minor at least the one given).
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("QHX_BUILD_COMMIT"),
    "; QNN core API 2.10 or newer 2.x, QNN system API 1.1 or newer 1.x)"
);

/// The commit the binary was built from ("unknown" outside a git checkout).
pub const BUILD_COMMIT: &str = env!("QHX_BUILD_COMMIT");

/// A usage error: the command line is wrong, nothing was loaded. Binaries exit 2.
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// Build a usage error for `anyhow` results.
pub fn usage(msg: impl std::fmt::Display) -> anyhow::Error {
    anyhow::Error::new(UsageError(msg.to_string()))
}

/// Sampling flags. Each is optional so that a flag given on the command line can be told
/// from its default: a Genie bundle's own `sampler` block applies when none is given.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 = greedy (default 0, for drop-in parity; a Genie bundle's
    /// `sampler` block applies when no sampling flag is given).
    #[arg(long, value_name = "T")]
    pub temp: Option<f32>,
    /// Keep only the K most likely tokens (default 0 = off).
    #[arg(long, value_name = "K")]
    pub top_k: Option<usize>,
    /// Nucleus sampling: keep the smallest set with cumulative probability >= P (default 1 = off).
    #[arg(long, value_name = "P")]
    pub top_p: Option<f32>,
    /// Drop tokens with probability below P x the most likely one's (default 0 = off).
    #[arg(long, value_name = "P")]
    pub min_p: Option<f32>,
    /// Penalise tokens seen in the last --repeat-last-n tokens (default 1 = off).
    #[arg(long, value_name = "X")]
    pub repeat_penalty: Option<f32>,
    /// Window of the repetition penalty (default 64; 0 = off, -1 = the whole context, as
    /// in llama.cpp).
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = parse_repeat_last_n)]
    pub repeat_last_n: Option<usize>,
    /// RNG seed: the same seed and bundle give the same output (default: random).
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    /// Whether any sampling flag was given at all.
    pub fn any_given(&self) -> bool {
        let SamplingArgs {
            temp,
            top_k,
            top_p,
            min_p,
            repeat_penalty,
            repeat_last_n,
            seed,
        } = self;
        temp.is_some()
            || top_k.is_some()
            || top_p.is_some()
            || min_p.is_some()
            || repeat_penalty.is_some()
            || repeat_last_n.is_some()
            || seed.is_some()
    }

    /// Flags that only a sampling (non-greedy) chain reads, when set away from their
    /// defaults: at temperature 0 they do nothing, which deserves a warning.
    pub fn ignored_at_greedy(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        if self.top_k.is_some_and(|k| k > 1) {
            v.push("--top-k");
        }
        if self.top_p.is_some_and(|p| p != 1.0) {
            v.push("--top-p");
        }
        if self.min_p.is_some_and(|p| p != 0.0) {
            v.push("--min-p");
        }
        if self.seed.is_some() {
            v.push("--seed");
        }
        v
    }

    /// Validate ranges and build the sampler configuration, with the defaults for flags not
    /// given. The seed is always resolved (drawn from the OS when not given), so the one
    /// used can be printed and replayed.
    pub fn config(&self) -> Result<SamplerConfig, String> {
        let d = SamplerConfig::default();
        let cfg = SamplerConfig {
            temp: self.temp.unwrap_or(d.temp),
            top_k: self.top_k.unwrap_or(d.top_k),
            top_p: self.top_p.unwrap_or(d.top_p),
            min_p: self.min_p.unwrap_or(d.min_p),
            repeat_penalty: self.repeat_penalty.unwrap_or(d.repeat_penalty),
            repeat_last_n: self.repeat_last_n.unwrap_or(d.repeat_last_n),
            seed: Some(self.seed.unwrap_or_else(rand::random)),
        };
        cfg.check(|k| format!("--{k}"))?;
        Ok(cfg)
    }
}

/// Speculative decoding flags (qhx_generate and qhx_server).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct SpecArgs {
    /// Speculative decoding: draft tokens cheaply and verify them in one execute of a step
    /// that takes several rows over the cache (the bundle's verify graph, a chunked
    /// prefill, a Genie AR-N variant). `lookup`: the tokens that followed the latest
    /// earlier occurrence of the text's last words (prompt lookup). `lookahead`: Jacobi
    /// guesses carried in the verify's spare rows and the n-gram pool they build (Genie's
    /// `lade`). `draft BUNDLE`: a second bundle with the same tokenizer drafts greedily,
    /// on the same backend. Greedy output is unchanged; sampled output keeps its
    /// distribution. With --bench, each tg test also runs as a `tgN+<mode>` row.
    #[arg(long, value_name = "lookup|lookahead|draft BUNDLE", num_args = 1..=2)]
    pub spec: Option<Vec<String>>,
    /// Most drafted tokens per verify (--spec) [default: 8; the verify step's rows less one
    /// bound it too].
    #[arg(long, value_name = "N", requires = "spec", value_parser = generate::parse_n_tokens)]
    pub draft_max: Option<usize>,
    /// Fewest drafted tokens worth a verify; fewer run as a plain decode step (--spec)
    /// [default: 1].
    #[arg(long, value_name = "N", requires = "spec", value_parser = generate::parse_n_tokens)]
    pub draft_min: Option<usize>,
    /// When a verify pays (--spec): it costs about R decode steps and yields the accepted
    /// drafts plus one token, so speculation switches itself off while the running yield
    /// is below R and on again when the drafts it skipped would have paid. `measure`: R
    /// from the executes' wall times; a number: R as given (e.g. the exporter's --estimate
    /// of the verify and decode graphs); `off`: verify every draft [default: measure].
    #[arg(long, value_name = "measure|R|off", requires = "spec", value_parser = parse_adaptive)]
    pub spec_adaptive: Option<crate::speculative::Adaptive>,
    /// Shortest and longest suffix, in tokens, that prompt lookup matches (--spec lookup;
    /// vLLM's prompt_lookup_min / _max) [default: 2 and 4].
    #[arg(long, value_name = "N", requires = "spec", value_parser = generate::parse_n_tokens)]
    pub lookup_min: Option<usize>,
    #[arg(long, value_name = "N", requires = "spec", value_parser = generate::parse_n_tokens)]
    pub lookup_max: Option<usize>,
    /// --spec lookahead: Jacobi guesses carried ahead of the current token (bounded by the
    /// verify step's rows less one), the pool's n-gram length, and the n-grams it keeps
    /// per first token (Genie lade's window / ngram / gcap) [default: 7, 4, 8].
    #[arg(long, value_name = "W", requires = "spec", value_parser = generate::parse_n_tokens)]
    pub lookahead_window: Option<usize>,
    #[arg(long, value_name = "N", requires = "spec", value_parser = parse_ngram)]
    pub lookahead_ngram: Option<usize>,
    #[arg(long, value_name = "G", requires = "spec", value_parser = generate::parse_n_tokens)]
    pub lookahead_gcap: Option<usize>,
    /// --spec draft: stop drafting at a pick the draft model gives less than this
    /// probability (0 drafts --draft-max every time) [default: 0.75].
    #[arg(long, value_name = "P", requires = "spec", value_parser = parse_p_min)]
    pub draft_p_min: Option<f32>,
}

impl SpecArgs {
    /// The speculation settings, with the defaults for flags not given (None: no `--spec`).
    pub fn config(&self) -> Result<Option<crate::speculative::SpecConfig>, String> {
        use crate::speculative::DraftKind;
        let Some(vals) = &self.spec else {
            return Ok(None);
        };
        let kind = parse_spec(&vals[0])?;
        let draft_bundle = match (kind, vals.get(1)) {
            (DraftKind::Draft, Some(b)) => Some(std::path::PathBuf::from(b)),
            (DraftKind::Draft, None) => {
                return Err("--spec draft needs the draft bundle: --spec draft BUNDLE".into())
            }
            (_, Some(v)) => {
                return Err(format!(
                    "--spec {} takes no bundle, but {v:?} followed it (put --spec after the positional arguments)",
                    vals[0]
                ))
            }
            (_, None) => None,
        };
        let given = |set: bool, flag: &str, mode: DraftKind| {
            if set && kind != mode {
                Err(format!("{flag} is an option of --spec {}", mode.as_str()))
            } else {
                Ok(())
            }
        };
        given(self.lookup_min.is_some(), "--lookup-min", DraftKind::Lookup)?;
        given(self.lookup_max.is_some(), "--lookup-max", DraftKind::Lookup)?;
        given(
            self.lookahead_window.is_some(),
            "--lookahead-window",
            DraftKind::Lookahead,
        )?;
        given(
            self.lookahead_ngram.is_some(),
            "--lookahead-ngram",
            DraftKind::Lookahead,
        )?;
        given(
            self.lookahead_gcap.is_some(),
            "--lookahead-gcap",
            DraftKind::Lookahead,
        )?;
        given(
            self.draft_p_min.is_some(),
            "--draft-p-min",
            DraftKind::Draft,
        )?;
        let d = crate::speculative::SpecConfig::of(kind);
        let la = crate::speculative::LookaheadConfig {
            window: self.lookahead_window.unwrap_or(d.lookahead.window),
            ngram: self.lookahead_ngram.unwrap_or(d.lookahead.ngram),
            gcap: self.lookahead_gcap.unwrap_or(d.lookahead.gcap),
        };
        let sp = crate::speculative::SpecConfig {
            kind,
            draft_max: self.draft_max.unwrap_or(d.draft_max),
            draft_min: self.draft_min.unwrap_or(d.draft_min),
            adaptive: self.spec_adaptive.unwrap_or(d.adaptive),
            ngram_min: self.lookup_min.unwrap_or(d.ngram_min),
            ngram_max: self.lookup_max.unwrap_or(d.ngram_max),
            lookahead: la,
            draft_p_min: self.draft_p_min.unwrap_or(d.draft_p_min),
            draft_bundle,
        };
        if sp.ngram_min > sp.ngram_max {
            return Err(format!(
                "--lookup-min {} is more than --lookup-max {}",
                sp.ngram_min, sp.ngram_max
            ));
        }
        if sp.draft_min > sp.draft_max {
            return Err(format!(
                "--draft-min {} is more than --draft-max {}",
                sp.draft_min, sp.draft_max
            ));
        }
        Ok(Some(sp))
    }
}

fn parse_adaptive(s: &str) -> std::result::Result<crate::speculative::Adaptive, String> {
    use crate::speculative::Adaptive;
    match s {
        "measure" => Ok(Adaptive::Measure),
        "off" => Ok(Adaptive::Off),
        _ => match s.parse::<f64>() {
            Ok(r) if r.is_finite() && r > 0.0 => Ok(Adaptive::Cost(r)),
            _ => Err(format!(
                "{s:?}: expected measure, off, or a verify cost in decode steps (a positive number)"
            )),
        },
    }
}

fn parse_spec(s: &str) -> std::result::Result<crate::speculative::DraftKind, String> {
    use crate::speculative::DraftKind;
    match s {
        "lookup" => Ok(DraftKind::Lookup),
        "lookahead" => Ok(DraftKind::Lookahead),
        "draft" => Ok(DraftKind::Draft),
        _ => Err(format!(
            "--spec {s:?}: expected lookup, lookahead or draft BUNDLE"
        )),
    }
}

/// `--lookahead-ngram`: 2 or more (a 1-gram drafts nothing).
fn parse_ngram(s: &str) -> std::result::Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if n >= 2 => Ok(n),
        _ => Err(format!("{s:?}: expected an n-gram length of 2 or more")),
    }
}

/// `--draft-p-min`: a probability in [0, 1].
fn parse_p_min(s: &str) -> std::result::Result<f32, String> {
    match s.trim().parse::<f32>() {
        Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
        _ => Err(format!("{s:?}: expected a probability from 0 to 1")),
    }
}

/// `--repeat-last-n`: a window size, 0 (off) or -1 (the whole context).
fn parse_repeat_last_n(s: &str) -> Result<usize, String> {
    match s.trim().parse::<i64>() {
        Ok(-1) => Ok(crate::sampler::WHOLE_CONTEXT),
        Ok(n) if n >= 0 => usize::try_from(n).map_err(|_| format!("{n} is too large")),
        Ok(n) => Err(format!(
            "{n}: expected a window size, 0 (off) or -1 (whole context)"
        )),
        Err(_) => Err(format!("{s:?} is not a whole number")),
    }
}

/// Parse `argv` for a binary named `prog`. `--help`/`--version` print and give
/// `Err(SUCCESS)`; a usage error prints one line (clap's first line, then where to look)
/// and gives `Err(2)`, so `main` can return the code as it is.
pub fn parse_or_exit<T: clap::Parser, I, A>(
    prog: &str,
    argv: I,
) -> Result<T, std::process::ExitCode>
where
    I: IntoIterator<Item = A>,
    A: Into<std::ffi::OsString> + Clone,
{
    match T::try_parse_from(argv) {
        Ok(a) => Ok(a),
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            Err(std::process::ExitCode::SUCCESS)
        }
        Err(e) => {
            crate::elog!(
                "{prog}: usage error: {} (see {prog} --help)",
                clap_message(&e.to_string())
            );
            Err(std::process::ExitCode::from(2))
        }
    }
}

/// clap's error text as one line: the message with every line of its detail (e.g. the
/// whole list of missing arguments), without the usage block and the `--help` tip.
fn clap_message(text: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with("Usage:") || t.starts_with("For more information") {
            break;
        }
        if !t.is_empty() {
            parts.push(t.strip_prefix("error: ").unwrap_or(t));
        }
    }
    if parts.is_empty() {
        return "invalid arguments".into();
    }
    parts.join(" ")
}

/// Turn a binary's result into its exit code: errors print as one line on stderr and
/// exit 1 (2 for a [`UsageError`]); a closed stdout (e.g. `| head`) is not an error.
pub fn finish(prog: &str, r: anyhow::Result<std::process::ExitCode>) -> std::process::ExitCode {
    match r {
        Ok(code) => code,
        Err(e) if is_broken_pipe(&e) => std::process::ExitCode::SUCCESS,
        Err(e) if e.downcast_ref::<UsageError>().is_some() => {
            crate::elog!("{prog}: usage error: {e} (see {prog} --help)");
            std::process::ExitCode::from(2)
        }
        Err(e) => {
            let msg = format!("{e:#}").replace('\n', " ");
            crate::elog!("{prog}: error: {msg}");
            std::process::ExitCode::from(1)
        }
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clap_messages_keep_every_missing_argument() {
        let text = "error: the following required arguments were not provided:\n  <BACKEND_LIB>\n  <SYSTEM_LIB>\n  <ARTIFACTS_ROOT>\n\nUsage: qhx_generate <MANIFEST> <BACKEND_LIB> <SYSTEM_LIB> <ARTIFACTS_ROOT> [N_TOKENS] [PROMPT]\n\nFor more information, try '--help'.\n";
        assert_eq!(
            clap_message(text),
            "the following required arguments were not provided: <BACKEND_LIB> <SYSTEM_LIB> <ARTIFACTS_ROOT>"
        );
    }

    #[test]
    fn the_version_names_the_api_floor_the_loader_enforces() {
        let core = qnn_sys::interface::MIN_CORE_API;
        let sys = qnn_sys::system::MIN_SYSTEM_API;
        assert!(LONG_VERSION.contains(&format!("core API {}.{} ", core.major, core.minor)));
        assert!(LONG_VERSION.contains(&format!("system API {}.{} ", sys.major, sys.minor)));
        assert!(LONG_VERSION.contains(BUILD_COMMIT));
    }
}
