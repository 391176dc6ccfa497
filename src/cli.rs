//! Command-line argument groups shared by the binaries (flag names follow llama.cpp).

use crate::sampler::SamplerConfig;

#[derive(clap::Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 = greedy (the default, for drop-in parity).
    #[arg(long, default_value_t = 0.0)]
    pub temp: f32,
    /// Keep only the K most likely tokens (0 = off).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Nucleus sampling: keep the smallest set with cumulative probability >= P (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Drop tokens with probability below P x the most likely one's (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    /// Penalise tokens seen in the last --repeat-last-n tokens (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Window of the repetition penalty (0 = whole sequence).
    #[arg(long, default_value_t = 64)]
    pub repeat_last_n: usize,
    /// RNG seed: the same seed and bundle give the same output (default: random).
    #[arg(long)]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    /// Validate ranges and build the sampler configuration.
    pub fn config(&self) -> Result<SamplerConfig, String> {
        let bad = |what: &str, v: f32| Err(format!("{what} {v} is out of range"));
        if !self.temp.is_finite() || self.temp < 0.0 {
            return bad("--temp", self.temp);
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("--top-p (0, 1]", self.top_p);
        }
        if !(0.0..1.0).contains(&self.min_p) {
            return bad("--min-p [0, 1)", self.min_p);
        }
        if !(self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0) {
            return bad("--repeat-penalty", self.repeat_penalty);
        }
        Ok(SamplerConfig {
            temp: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            seed: self.seed,
        })
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
            let text = e.to_string();
            let first = text.lines().next().unwrap_or("invalid arguments");
            let first = first.strip_prefix("error: ").unwrap_or(first);
            eprintln!("{prog}: usage error: {first} (see {prog} --help)");
            Err(std::process::ExitCode::from(2))
        }
    }
}

/// Turn a binary's result into its exit code: errors print as one line on stderr and
/// exit 1; a closed stdout (e.g. `| head`) is not an error.
pub fn finish(prog: &str, r: anyhow::Result<std::process::ExitCode>) -> std::process::ExitCode {
    match r {
        Ok(code) => code,
        Err(e) if is_broken_pipe(&e) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            let msg = format!("{e:#}").replace('\n', " ");
            eprintln!("{prog}: error: {msg}");
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
