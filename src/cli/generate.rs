//! `qhx_generate`'s command line and its validation into a [`Request`].
//!
//! Everything that can be checked without loading the bundle is checked here, before the
//! (slow, on a phone) load: argument order, numbers, id lists, message files, the prompt,
//! the chat template. Such problems are usage errors (exit 2).

use super::{usage, SamplingArgs};
use crate::bench::{BenchConfig, Format};
use crate::bundle::Spec;
use crate::cancel::CancelToken;
use crate::chat::Message;
use crate::engine::GenConfig;
use crate::load::{ContextLoad, LoadOptions};
use crate::qnn::PerfMode;
use crate::reasoning;
use crate::sampler::SamplerConfig;
use crate::session::{self, Chat, Prompt as SessionPrompt, TextRequest};
use anyhow::{bail, Context as _, Result};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

#[derive(clap::Parser, Debug)]
#[command(
    name = "qhx_generate",
    version = super::LONG_VERSION,
    allow_negative_numbers = true,
    about = "Generate text with a QNN context-binary LLM bundle on the Hexagon NPU",
    after_help = "Argument order is invariant: <manifest> <libQnnHtp.so> <libQnnSystem.so> <artifacts_root> [n_tokens] [prompt]\n\
                  With --bench, -p/-n/-r mean --pp/--tg/--repetitions, as in llama-bench."
)]
pub struct Args {
    /// Bundle description: a qhx manifest (schema_version 1 or 2) or a genie_config.json.
    pub manifest: PathBuf,
    /// QNN backend library (libQnnHtp.so / QnnHtp.dll).
    pub backend_lib: PathBuf,
    /// QNN system library (libQnnSystem.so / QnnSystem.dll).
    pub system_lib: PathBuf,
    /// Directory the manifest's artifact names resolve against. (The public clone's order
    /// MANIFEST HTP SYSTEM PROMPT [N] is understood when this is not an existing path and
    /// reads as text: it holds a space and no path separator.)
    pub artifacts_root: OsString,
    /// Number of tokens to generate [default: 64].
    pub n_tokens: Option<String>,
    /// Prompt text (raw completion; no chat template).
    pub prompt: Option<OsString>,
    /// Prompt text (alternative to the positional prompt).
    #[arg(short = 'p', long = "prompt", value_name = "TEXT")]
    pub prompt_flag: Option<OsString>,
    /// Tokens to generate (alternative to the positional n_tokens).
    #[arg(short = 'n', long = "n-predict", value_name = "N", value_parser = parse_n_tokens)]
    pub n_predict: Option<usize>,
    /// Print one JSON document on stdout at the end instead of streaming text.
    #[arg(long)]
    pub json: bool,
    /// More diagnostics on stderr (-v: sampler chain and seed, QNN warnings and info;
    /// -vv: verbose QNN log).
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// No banner and no stats on stderr (warnings and errors still print).
    #[arg(short = 'q', long, conflicts_with = "verbose")]
    pub quiet: bool,
    /// Keep going when logits or hidden states contain NaN/Inf.
    #[arg(long)]
    pub allow_nonfinite: bool,
    /// Stop when the output contains STRING (repeatable); the stop string is not printed.
    #[arg(short = 'r', long = "stop", value_name = "STRING")]
    pub stop: Vec<String>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Teacher forcing for precision checks: feed these ids (same forms as --expect-tokens)
    /// one per step instead of the sampled ones; output_ids are the model's own top-1 picks
    /// at each step.
    #[arg(long, value_name = "IDS|FILE", conflicts_with = "expect_tokens")]
    pub teacher_force: Option<String>,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    #[command(flatten)]
    pub speculation: super::SpecArgs,
    /// Parity mode: greedy-generate as many tokens as given and exit 3 at the first
    /// divergence. Takes a comma list of ids, or a JSON file (an array, or an object with
    /// `gold_ids` / `gold_ids_prefix` / `output_ids`).
    #[arg(long, value_name = "IDS|FILE")]
    pub expect_tokens: Option<String>,
    /// HTP performance vote held for the run: burst, high, balanced, power_saver, default
    /// (no vote). A refused vote is a warning.
    #[arg(long, default_value = "burst", value_parser = parse_perf)]
    pub perf: PerfMode,
    /// Create the contexts of a multi-binary bundle concurrently after the first one
    /// (faster loads; off by default: the x86 HTP backend crashed when two context
    /// creations overlapped; unverified on hardware).
    #[arg(long)]
    pub parallel_load: bool,
    /// rpcmem library for zero-copy I/O (default libcdsprpc.so; env QHX_RPCMEM_LIB).
    /// Client buffers are used when it cannot be loaded; "none" disables it.
    #[arg(long, value_name = "LIB")]
    pub rpcmem_lib: Option<PathBuf>,
    /// Benchmark mode, as llama-bench: for each --pp and --tg size a warm-up, then -r
    /// timed repetitions; rows print as tests end. No n_tokens or prompt needed.
    #[arg(long)]
    pub bench: bool,
    /// Benchmark repetitions (`-r` with --bench) [default: 5].
    #[arg(long = "repetitions", value_name = "N", value_parser = parse_n_tokens)]
    pub repetitions: Option<usize>,
    /// Benchmark prompt lengths, comma-separated (`-p` with --bench); 0 skips [default: 128].
    #[arg(long, value_name = "N,…", value_delimiter = ',', value_parser = parse_list)]
    pub pp: Option<Vec<usize>>,
    /// Benchmark generation lengths, comma-separated (`-n` with --bench); 0 skips
    /// [default: 128].
    #[arg(long, value_name = "N,…", value_delimiter = ',', value_parser = parse_list)]
    pub tg: Option<Vec<usize>>,
    /// Benchmark output: md (default), csv, json or jsonl, with llama-bench's field names.
    #[arg(short = 'o', long = "output", value_name = "md|csv|json|jsonl")]
    pub output: Option<Format>,
    /// Prompt from a file (`-` = stdin), instead of the positional prompt / -p.
    #[arg(short = 'f', long = "file", value_name = "FILE", conflicts_with_all = ["prompt", "prompt_flag"])]
    pub file: Option<PathBuf>,
    /// Print the prompt's ids and pieces on stderr before generating.
    #[arg(long)]
    pub verbose_prompt: bool,
    /// Render the prompt as a user turn with the bundle's chat template.
    #[arg(long)]
    pub chat: bool,
    /// System message for --chat / -i (also accepted as `-sys TEXT`).
    #[arg(long = "system", value_name = "TEXT")]
    pub system: Option<String>,
    /// --chat: the conversation so far, a JSON array of {"role", "content"}; the prompt,
    /// if any, is appended as a user turn.
    #[arg(long, value_name = "FILE")]
    pub messages: Option<PathBuf>,
    /// Reasoning blocks (`<think> … </think>`): show, hide (print and save only what follows
    /// `</think>`) or strip (print everything, save only the answer).
    #[arg(long, default_value = "show", value_name = "show|hide|strip")]
    pub reasoning: reasoning::Mode,
    /// Force `</think>` after N generated tokens while the reasoning block is open.
    #[arg(long, value_name = "N", value_parser = parse_n_tokens)]
    pub reasoning_budget: Option<usize>,
    /// Interactive chat: read user turns from stdin line by line (/reset, /stats, EOF
    /// exits; Ctrl-C stops the current reply); n_tokens is the per-turn maximum.
    #[arg(short = 'i', long = "interactive", conflicts_with_all = ["json", "expect_tokens", "messages", "bench"])]
    pub interactive: bool,
    /// -i: rewrite this JSON file ({"messages", "ids"}) after every turn.
    #[arg(long, value_name = "FILE")]
    pub transcript: Option<PathBuf>,
    /// Constrain the output to this JSON schema (inline JSON, as llama.cpp's -j;
    /// `{}` or `{"type":"object"}` = any JSON object).
    #[arg(short = 'j', long = "json-schema", value_name = "SCHEMA", conflicts_with_all = ["json_schema_file", "grammar", "grammar_file"])]
    pub json_schema: Option<String>,
    /// Constrain the output to the JSON schema in FILE.
    #[arg(long = "json-schema-file", value_name = "FILE", conflicts_with_all = ["grammar", "grammar_file"])]
    pub json_schema_file: Option<PathBuf>,
    /// Constrain the output to a grammar: GBNF (llama.cpp's, `root ::= ...`) or Lark.
    #[arg(long, value_name = "GRAMMAR", conflicts_with = "grammar_file")]
    pub grammar: Option<String>,
    /// Constrain the output to the grammar in FILE (GBNF or Lark).
    #[arg(long = "grammar-file", value_name = "FILE")]
    pub grammar_file: Option<PathBuf>,
    /// Offer these tools (a JSON array of OpenAI-style specs): they are rendered through the
    /// chat template (implies --chat), a tool call in the reply is kept well-formed, and
    /// --json reports the parsed `tool_calls`.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["json_schema", "json_schema_file", "grammar", "grammar_file"])]
    pub tools: Option<PathBuf>,
    /// With --tools: `auto` (the reply is a tool call or plain text) or `required` (it is
    /// a tool call).
    #[arg(long, value_name = "auto|required", default_value = "auto", value_parser = ["auto", "required"])]
    pub tool_choice: String,
    /// Feed these prompt token ids instead of a text prompt (bypasses the tokenizer; no BOS
    /// is added). The file holds ids separated by whitespace or commas, or a JSON array.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["prompt", "prompt_flag"])]
    pub tokens_in: Option<PathBuf>,
}

/// Map llama.cpp spellings clap cannot express: `-sys TEXT` (a multi-letter short flag) is
/// `--system`; with `--bench`, `-p`, `-n` and `-r` are llama-bench's prompt sizes,
/// generation sizes and repetitions.
pub fn map_argv(argv: impl Iterator<Item = OsString>) -> Vec<OsString> {
    let mut v: Vec<OsString> = argv
        .map(|a| if a == "-sys" { "--system".into() } else { a })
        .collect();
    if v.iter().any(|a| a == "--bench") {
        for a in v.iter_mut().skip(1) {
            let to = match a.to_str() {
                Some("-p") => "--pp",
                Some("-n") => "--tg",
                Some("-r") => "--repetitions",
                _ => continue,
            };
            *a = to.into();
        }
    }
    v
}

fn parse_perf(s: &str) -> std::result::Result<PerfMode, String> {
    PerfMode::parse(s).ok_or_else(|| {
        format!("--perf {s:?}: expected burst, high, balanced, power_saver or default")
    })
}

/// One size of a comma list (`32,64,128`); 0 is allowed (the test is skipped).
fn parse_list(s: &str) -> std::result::Result<usize, String> {
    s.trim()
        .parse::<usize>()
        .map_err(|_| format!("{s:?} is not a whole number of tokens"))
}

pub fn parse_n_tokens(s: &str) -> std::result::Result<usize, String> {
    let n: i64 = s.trim().parse().map_err(|e: std::num::ParseIntError| {
        use std::num::IntErrorKind::{NegOverflow, PosOverflow};
        match e.kind() {
            PosOverflow => format!("{s} is beyond any context length"),
            NegOverflow => format!("must be at least 1 (got {s})"),
            _ => format!("{s:?} is not a whole number of tokens"),
        }
    })?;
    if n <= 0 {
        return Err(format!("must be at least 1 (got {n})"));
    }
    if n > 1_000_000 {
        return Err(format!("{n} is beyond any context length"));
    }
    Ok(n as usize)
}

/// What to do once the bundle is loaded.
#[derive(Debug)]
pub enum Mode {
    /// Generate once; `expected` makes it a parity run (exit 3 on divergence).
    OneShot {
        json: bool,
        expected: Option<Vec<u32>>,
        teacher: Option<Vec<u32>>,
    },
    Interactive {
        transcript: Option<PathBuf>,
    },
    Bench {
        cfg: BenchConfig,
        format: Format,
    },
}

/// The prompt as given, before tokenizing.
#[derive(Debug)]
pub enum Prompt {
    /// Raw completion text (BOS added per the manifest).
    Text(String),
    /// Ids from `--tokens-in`, fed as they are.
    Ids(Vec<u32>),
    /// A conversation rendered with the chat template.
    Chat(Vec<Message>),
    /// `-i` without a first turn, or `--bench`.
    None,
}

/// A validated command line.
#[derive(Debug)]
pub struct Request {
    /// The bundle description: a manifest or a Genie config.
    pub bundle: std::sync::Arc<Spec>,
    pub backend_lib: PathBuf,
    pub system_lib: PathBuf,
    /// Tokens to generate (per turn with `-i`).
    pub n_tokens: usize,
    pub prompt: Prompt,
    pub mode: Mode,
    pub sampler: SamplerConfig,
    /// The sampler is the Genie config's `sampler` block (no sampling flag was given).
    pub sampler_from_bundle: bool,
    pub stops: Vec<String>,
    pub reasoning: reasoning::Mode,
    pub reasoning_budget: Option<usize>,
    pub system: Option<String>,
    pub load: LoadOptions,
    pub verbose: u8,
    pub quiet: bool,
    pub verbose_prompt: bool,
    pub allow_nonfinite: bool,
    pub ignore_eos: bool,
    /// `--spec`: speculative decoding settings.
    pub spec: Option<crate::speculative::SpecConfig>,
    /// Structured output: the grammar or schema, with the tokenizer's vocabulary read for it.
    pub grammar: Option<(std::sync::Arc<crate::grammar::Vocab>, crate::grammar::Spec)>,
    /// `--tools`: offered through the chat template; `--json` reports the parsed calls.
    pub tools: Option<crate::tools::Tools>,
    pub cancel: CancelToken,
    /// Things to tell the user before loading (argument order understood, sampling flags
    /// without effect).
    pub notes: Vec<String>,
}

/// The positionals after the libraries, with the argument order resolved.
struct Positional {
    root: PathBuf,
    n_tokens: Option<String>,
    prompt: Option<OsString>,
    note: Option<String>,
}

/// `ROOT [N] [PROMPT]`, or the public clone's `PROMPT [N]`. The latter is read only when the
/// fourth argument is not an existing path, there is no sixth, and it reads as text (a
/// space, no path separator): a mistyped directory must fail, never become a prompt.
fn positional(args: &Args) -> Positional {
    let fourth = PathBuf::from(&args.artifacts_root);
    let text = args.artifacts_root.to_string_lossy();
    let reads_as_text =
        text.chars().any(char::is_whitespace) && !text.contains(['/', std::path::MAIN_SEPARATOR]);
    if fourth.exists() || args.prompt.is_some() || !reads_as_text {
        return Positional {
            root: fourth,
            n_tokens: args.n_tokens.clone(),
            prompt: args.prompt.clone(),
            note: None,
        };
    }
    let root = match args.manifest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let note = format!(
        "{:?} is not a path: reading the arguments as MANIFEST HTP SYSTEM PROMPT [N] \
         (artifacts resolve against {})",
        args.artifacts_root,
        root.display()
    );
    Positional {
        root,
        n_tokens: args.n_tokens.clone(),
        prompt: Some(args.artifacts_root.clone()),
        note: Some(note),
    }
}

/// The prompt as text; non-UTF-8 bytes are a usage error that points at them.
fn utf8_prompt(p: OsString) -> Result<String> {
    p.into_string().map_err(|raw| {
        let lossy = raw.to_string_lossy();
        let at = lossy.find('\u{FFFD}').unwrap_or(0);
        usage(format!(
            "the prompt is not valid UTF-8 (first bad byte near offset {at}); pass text, or ids with --tokens-in"
        ))
    })
}

/// Flags that only one mode reads are refused in the others: a flag that does nothing
/// would pass for one that worked.
fn check_mode_flags(args: &Args, pos: &Positional) -> Result<()> {
    if !args.bench {
        for (given, flag) in [
            (args.pp.is_some(), "--pp"),
            (args.tg.is_some(), "--tg"),
            (args.repetitions.is_some(), "--repetitions"),
            (args.output.is_some(), "-o/--output"),
        ] {
            if given {
                bail!(usage(format!("{flag} is a --bench option")));
            }
        }
    } else {
        let s = &args.sampling;
        let not_for_bench: Vec<&str> = [
            (pos.prompt.is_some(), "a prompt (prompt sizes are -p N,…)"),
            (
                pos.n_tokens.is_some(),
                "n_tokens (generation sizes are -n N,…)",
            ),
            (args.file.is_some(), "-f"),
            (args.tokens_in.is_some(), "--tokens-in"),
            (
                s.any_given(),
                "sampling flags (the benchmark decodes greedily)",
            ),
            (!args.stop.is_empty(), "--stop"),
            (
                args.ignore_eos,
                "--ignore-eos (the benchmark never stops early)",
            ),
            (args.chat, "--chat"),
            (args.system.is_some(), "--system"),
            (args.reasoning != reasoning::Mode::Show, "--reasoning"),
            (args.reasoning_budget.is_some(), "--reasoning-budget"),
            (args.teacher_force.is_some(), "--teacher-force"),
            (args.expect_tokens.is_some(), "--expect-tokens"),
            (args.verbose_prompt, "--verbose-prompt"),
            (grammar_given(args), "a grammar or JSON schema"),
        ]
        .into_iter()
        .filter_map(|(given, what)| given.then_some(what))
        .collect();
        if !not_for_bench.is_empty() {
            bail!(usage(format!(
                "--bench does not take {}",
                not_for_bench.join(", ")
            )));
        }
    }
    if grammar_given(args) {
        for (given, flag) in [
            (args.interactive, "-i"),
            (
                args.ignore_eos,
                "--ignore-eos (the grammar's end is the end)",
            ),
            (args.teacher_force.is_some(), "--teacher-force"),
            (args.expect_tokens.is_some(), "--expect-tokens"),
            (args.reasoning_budget.is_some(), "--reasoning-budget"),
        ] {
            if given {
                bail!(usage(format!(
                    "structured output (-j/--grammar) does not combine with {flag}"
                )));
            }
        }
    }
    if args.transcript.is_some() && !args.interactive {
        bail!(usage(
            "--transcript records an interactive chat: it needs -i"
        ));
    }
    Ok(())
}

fn grammar_given(args: &Args) -> bool {
    args.tools.is_some()
        || args.json_schema.is_some()
        || args.json_schema_file.is_some()
        || args.grammar.is_some()
        || args.grammar_file.is_some()
}

/// The structured-output spec the flags give (JSON parsed here: a bad schema is a usage
/// error before anything loads).
fn grammar_spec(args: &Args) -> Result<Option<crate::grammar::Spec>> {
    use crate::grammar::Spec as G;
    let read = |flag: &str, p: &Path| {
        std::fs::read_to_string(p)
            .map_err(|e| usage(format!("{flag} {}: cannot read ({e})", p.display())))
    };
    let schema = |flag: &str, text: &str| {
        serde_json::from_str::<serde_json::Value>(text)
            .map(|v| match v {
                // llama.cpp reads `{}` as "any JSON object".
                serde_json::Value::Object(o) if o.is_empty() => {
                    serde_json::json!({"type": "object"})
                }
                v => v,
            })
            .map_err(|e| usage(format!("{flag}: not JSON ({e})")))
    };
    Ok(if let Some(s) = &args.json_schema {
        Some(G::JsonSchema(schema("--json-schema", s)?))
    } else if let Some(f) = &args.json_schema_file {
        Some(G::JsonSchema(schema(
            "--json-schema-file",
            &read("--json-schema-file", f)?,
        )?))
    } else if let Some(g) = &args.grammar {
        Some(G::from_grammar_text(g))
    } else if let Some(f) = &args.grammar_file {
        Some(G::from_grammar_text(&read("--grammar-file", f)?))
    } else {
        None
    })
}

/// The flag (and file) the grammar came from, which its compile errors start with.
fn grammar_source(args: &Args) -> String {
    let file = |flag: &str, f: &Path| format!("{flag} {}", f.display());
    if let Some(f) = &args.tools {
        file("--tools", f)
    } else if let Some(f) = &args.json_schema_file {
        file("--json-schema-file", f)
    } else if let Some(f) = &args.grammar_file {
        file("--grammar-file", f)
    } else if args.json_schema.is_some() {
        "--json-schema".into()
    } else {
        "--grammar".into()
    }
}

/// The tokenizer's vocabulary for structured output, and the grammar compiled once against
/// it, so a grammar that does not compile or matches nothing fails before the load.
fn grammar_setup(
    bundle: &Spec,
    spec: crate::grammar::Spec,
    source: &str,
) -> Result<(std::sync::Arc<crate::grammar::Vocab>, crate::grammar::Spec)> {
    let vocab = bundle.grammar_vocab()?;
    crate::grammar::Constraint::new(&vocab, &spec).map_err(|e| usage(format!("{source}: {e}")))?;
    Ok((std::sync::Arc::new(vocab), spec))
}

/// The artifacts root must be a directory. When it is missing and reads as a number, the
/// root was most likely left out (the number is n_tokens): say so, as a usage error.
fn check_root(root: &Path, pos: &Positional) -> Result<()> {
    if root.is_dir() {
        return Ok(());
    }
    if !root.exists() {
        let text = root.to_string_lossy();
        if pos.note.is_none() && text.trim().parse::<i64>().is_ok() {
            bail!(usage(format!(
                "artifacts root {text:?} does not exist and reads as n_tokens: the order is \
                 <manifest> <backend_lib> <system_lib> <artifacts_root> [n_tokens] [prompt]"
            )));
        }
        bail!("artifacts root {} does not exist", root.display());
    }
    bail!("artifacts root {} is not a directory", root.display())
}

impl Request {
    /// Validate `args` (reading the manifest and any id, message or prompt files).
    pub fn from_args(args: Args, cancel: CancelToken) -> Result<Request> {
        let pos = positional(&args);
        check_mode_flags(&args, &pos)?;
        check_root(&pos.root, &pos)?;
        let tools = args
            .tools
            .as_deref()
            .map(|f| crate::tools::Tools::load(f).map_err(|e| usage(format!("--tools: {e}"))))
            .transpose()?;
        if tools.is_none() && args.tool_choice != "auto" {
            bail!(usage("--tool-choice needs --tools"));
        }
        let source = grammar_source(&args);
        let grammar = match &tools {
            Some(t) => Some(t.grammar(args.tool_choice == "required")),
            None => grammar_spec(&args)?,
        };
        let mut notes: Vec<String> = pos.note.into_iter().collect();
        let n_positional = pos
            .n_tokens
            .as_deref()
            .map(|s| parse_n_tokens(s).map_err(|e| usage(format!("invalid n_tokens {s:?}: {e}"))))
            .transpose()?;
        let n_tokens = match (n_positional, args.n_predict) {
            (Some(a), Some(b)) if a != b => {
                bail!(usage(format!(
                    "n_tokens {a} and -n {b} disagree; give one of them"
                )))
            }
            (a, b) => a.or(b).unwrap_or(64),
        };
        let mut sampler = args.sampling.config().map_err(usage)?;
        if sampler.temp <= 0.0 && !args.bench {
            let ignored = args.sampling.ignored_at_greedy();
            if !ignored.is_empty() {
                notes.push(format!(
                    "warning: {} {} no effect at --temp 0 (greedy decoding)",
                    ignored.join(", "),
                    if ignored.len() == 1 { "has" } else { "have" }
                ));
            }
        }
        let root = pos.root;
        // As llama-cli: a system message or a conversation file means chat mode.
        let chat = args.chat
            || args.interactive
            || args.messages.is_some()
            || args.system.is_some()
            || tools.is_some();
        let text = match (pos.prompt, args.prompt_flag, &args.file) {
            (Some(_), Some(_), _) => {
                bail!(usage(
                    "give the prompt either positionally or with -p, not both"
                ))
            }
            (Some(p), None, _) | (None, Some(p), _) => Some(utf8_prompt(p)?),
            (None, None, Some(f)) => Some(read_prompt_file(f)?),
            (None, None, None) => None,
        };
        let optional = args.tokens_in.is_some() || args.interactive || args.bench;
        if text.as_deref().is_some_and(str::is_empty) && !optional && args.messages.is_none() {
            bail!(usage("the prompt is empty"));
        }
        if text.is_none() && !optional && args.messages.is_none() {
            bail!(usage(
                "no prompt given (positional after n_tokens, -p TEXT or -f FILE)"
            ));
        }
        let expected = args
            .expect_tokens
            .as_deref()
            .map(|s| parse_ids(s, "--expect-tokens"))
            .transpose()?;
        let teacher = args
            .teacher_force
            .as_deref()
            .map(|s| parse_ids(s, "--teacher-force"))
            .transpose()?;
        let messages = match &args.messages {
            Some(f) => {
                Some(crate::chat::load_messages(f).map_err(|e| usage(format!("--messages: {e}")))?)
            }
            None => None,
        };
        if let Some(t) = &args.transcript {
            check_writable(t)?;
        }
        let (manifest, root) = resolve_manifest(
            &args.manifest,
            root,
            &args.backend_lib,
            &args.system_lib,
            &mut notes,
        )?;
        let bundle = Spec::load(&manifest, &root)?;
        bundle.check_files()?;
        let grammar = grammar
            .map(|g| grammar_setup(&bundle, g, &source))
            .transpose()?;
        // A Genie bundle's sampler block applies unless a sampling flag was given, as it
        // does under Genie; parity and teacher-forced runs stay greedy (see `Request`).
        let sampler_from_bundle = match bundle.sampling() {
            Some(s) if !args.sampling.any_given() => {
                for k in &s.ignored {
                    notes.push(format!("warning: {k} is not supported; ignored"));
                }
                sampler = s.config.clone();
                sampler.seed.get_or_insert_with(rand::random);
                if !sampler.is_greedy() && !args.bench && !args.quiet {
                    notes.push(format!(
                        "sampling as {} asks: {} (any sampling flag replaces it; --temp 0 is greedy)",
                        args.manifest.display(),
                        sampler.chain().join(" -> ")
                    ));
                }
                true
            }
            _ => false,
        };
        let (spec, note) =
            session::spec_or_bundle(args.speculation.config().map_err(usage)?, &bundle);
        if let Some(n) = note.filter(|_| !args.quiet && !args.bench) {
            notes.push(n);
        }
        let prompt = if let Some(f) = &args.tokens_in {
            Prompt::Ids(read_tokens_in(f, bundle.vocab())?)
        } else if chat && !args.interactive {
            let mut msgs = messages.unwrap_or_default();
            if let Some(s) = &args.system {
                if msgs.first().is_none_or(|x| x.role != "system") {
                    msgs.insert(0, Message::new("system", s));
                }
            }
            let text = text.unwrap_or_default();
            if !text.is_empty() || msgs.is_empty() {
                msgs.push(Message::new("user", &text));
            }
            Prompt::Chat(msgs)
        } else {
            match text {
                Some(t) if !t.is_empty() => Prompt::Text(t),
                _ => Prompt::None,
            }
        };
        if chat {
            // The template's own checks (e.g. roles must alternate) before the bundle loads.
            let tmpl = bundle.chat_template(None)?;
            let probe = match &prompt {
                Prompt::Chat(m) => m.clone(),
                _ => crate::chat::conversation(args.system.as_deref(), "hello"),
            };
            let probe = Chat {
                messages: probe,
                tools: tools.clone(),
                no_thinking: false,
            };
            session::render_chat(&tmpl, &probe).map_err(usage)?;
        }
        let mode = if args.bench {
            let format = match (args.output, args.json) {
                (Some(f), _) => f,
                (None, true) => Format::Json,
                (None, false) => Format::Md,
            };
            Mode::Bench {
                cfg: BenchConfig {
                    n_prompt: args.pp.unwrap_or_else(|| vec![128]),
                    n_gen: args.tg.unwrap_or_else(|| vec![128]),
                    repetitions: args.repetitions.unwrap_or(5),
                    allow_nonfinite: args.allow_nonfinite,
                    cancel: cancel.clone(),
                    spec: spec.clone(),
                },
                format,
            }
        } else if args.interactive {
            Mode::Interactive {
                transcript: args.transcript,
            }
        } else {
            Mode::OneShot {
                json: args.json,
                expected,
                teacher,
            }
        };
        let log_level = match args.verbose {
            0 => 0,
            1 => qnn_sys::log_level::INFO,
            _ => qnn_sys::log_level::VERBOSE,
        };
        let rpcmem_lib = match args
            .rpcmem_lib
            .or_else(|| std::env::var_os("QHX_RPCMEM_LIB").map(PathBuf::from))
        {
            Some(p) if p.as_os_str() == "none" => None,
            Some(p) => Some(p),
            None => LoadOptions::default().rpcmem_lib,
        };
        Ok(Request {
            bundle: std::sync::Arc::new(bundle),
            backend_lib: args.backend_lib,
            system_lib: args.system_lib,
            n_tokens,
            prompt,
            mode,
            sampler,
            sampler_from_bundle,
            stops: args.stop,
            reasoning: args.reasoning,
            reasoning_budget: args.reasoning_budget,
            system: args.system,
            load: LoadOptions {
                cancel: cancel.clone(),
                log_level,
                perf: args.perf,
                rpcmem_lib,
                progress: None,
                context_load: if args.parallel_load {
                    ContextLoad::FirstThenParallel
                } else {
                    ContextLoad::Serial
                },
                runtime: None,
            },
            verbose: args.verbose,
            quiet: args.quiet,
            verbose_prompt: args.verbose_prompt,
            allow_nonfinite: args.allow_nonfinite,
            ignore_eos: args.ignore_eos,
            spec,
            grammar,
            tools,
            cancel,
            notes,
        })
    }

    /// How this run's text is handled (stops, reasoning and its budget, the grammar).
    pub fn text_request(&self) -> TextRequest {
        TextRequest {
            stops: self.stops.clone(),
            reasoning: self.reasoning,
            reasoning_budget: self.reasoning_budget,
            grammar: self.grammar.clone(),
        }
    }

    /// The prompt as the session composes it (`-i` without one: nothing).
    pub fn session_prompt(&self) -> SessionPrompt {
        match &self.prompt {
            Prompt::Ids(v) => SessionPrompt::Ids(v.clone()),
            Prompt::Chat(m) => SessionPrompt::Chat(Chat {
                messages: m.clone(),
                tools: self.tools.clone(),
                no_thinking: false,
            }),
            Prompt::Text(t) => SessionPrompt::Text(t.clone()),
            Prompt::None => SessionPrompt::Ids(Vec::new()),
        }
    }

    /// A one-shot prompt must leave room to generate within the bundle's context. When a
    /// byte count cannot settle it (a token covers at least one byte of text, plus BOS and
    /// template specials), the tokenizer is read ahead of the load to count exactly.
    pub fn check_prompt_fits(&self) -> Result<()> {
        if !matches!(self.mode, Mode::OneShot { .. }) {
            return Ok(());
        }
        let max_ctx = self.bundle.max_ctx();
        let prompt = self.session_prompt();
        let n = match &prompt {
            SessionPrompt::Ids(v) => v.len(),
            SessionPrompt::Text(t) if 2 * t.len() + 2 < max_ctx => return Ok(()),
            SessionPrompt::Chat(c) => {
                let tmpl = self.bundle.chat_template(None)?;
                let text = session::render_chat(&tmpl, c).map_err(usage)?;
                if 2 * text.len() + 2 < max_ctx {
                    return Ok(());
                }
                self.count_ids(&prompt)?
            }
            SessionPrompt::Text(_) => self.count_ids(&prompt)?,
        };
        session::room(n, max_ctx)?;
        Ok(())
    }

    /// The prompt's length in ids, with the tokenizer alone (before the load).
    fn count_ids(&self, prompt: &SessionPrompt) -> crate::Result<usize> {
        let tok = crate::tokenizer::Tokenizer::load(self.bundle.tokenizer_path())?;
        let tmpl = || self.bundle.chat_template(Some(&tok));
        Ok(session::encode(prompt, tmpl, &tok, self.bundle.bos())?.len())
    }

    /// Generation settings for a one-shot run after a prompt of `prompt_len` ids: the
    /// token count (the expected or forced ids' length in parity and teacher runs), clamped
    /// to the context, and the count asked for. Parity and teacher runs are greedy.
    pub fn one_shot_config(&self, prompt_len: usize, max_ctx: usize) -> Result<(GenConfig, usize)> {
        let (expected, teacher) = match &self.mode {
            Mode::OneShot {
                expected, teacher, ..
            } => (expected, teacher),
            _ => (&None, &None),
        };
        let room = session::room(prompt_len, max_ctx)?;
        let wanted = expected
            .as_ref()
            .or(teacher.as_ref())
            .map_or(self.n_tokens, Vec::len);
        let cfg = GenConfig {
            n_tokens: wanted.min(room),
            allow_nonfinite: self.allow_nonfinite,
            ignore_eos: self.ignore_eos,
            sampler: if expected.is_some() || teacher.is_some() {
                SamplerConfig::default()
            } else {
                self.sampler.clone()
            },
            teacher: teacher.clone(),
            cancel: self.cancel.clone(),
            spec: self.spec.clone(),
        };
        Ok((cfg, wanted))
    }

    /// Per-turn settings for `-i`.
    pub fn turn_config(&self) -> GenConfig {
        GenConfig {
            n_tokens: self.n_tokens,
            allow_nonfinite: self.allow_nonfinite,
            ignore_eos: self.ignore_eos,
            sampler: self.sampler.clone(),
            teacher: None,
            cancel: self.cancel.clone(),
            spec: self.spec.clone(),
        }
    }
}

/// `--transcript FILE` must be writable before anything loads (not after the first turn).
/// A file that did not exist is not left behind.
fn check_writable(p: &Path) -> Result<()> {
    let existed = p.exists();
    match std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(p)
    {
        Ok(_) => {
            if !existed {
                let _ = std::fs::remove_file(p);
            }
            Ok(())
        }
        Err(e) => Err(usage(format!(
            "--transcript {}: cannot write ({e})",
            p.display()
        ))),
    }
}

/// Whether two paths name the same directory.
fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// A directory given as the manifest: its bundle description, as the SDK takes one. For a
/// bundle with one directory per HTP arch, the device's is taken (the backend is opened
/// only to ask), and it becomes the artifacts root too when the root given was the
/// directory itself. `notes` gets the file chosen.
pub fn resolve_manifest(
    given: &Path,
    root: PathBuf,
    backend: &Path,
    system: &Path,
    notes: &mut Vec<String>,
) -> Result<(PathBuf, PathBuf)> {
    use crate::bundle::{bundle_dir, pick_arch, BundleDir};
    use crate::load::device_arch;
    if !given.is_dir() {
        return Ok((given.to_path_buf(), root));
    }
    let (dir, found) = match bundle_dir(given)? {
        BundleDir::File(p) => (given.to_path_buf(), p),
        BundleDir::PerArch(arches) => {
            let arch = device_arch(backend, system).context(
                "asking the backend for its HTP arch, to pick the bundle's arch directory",
            )?;
            let sub = pick_arch(given, &arches, arch)?;
            match bundle_dir(&sub)? {
                BundleDir::File(p) => (sub, p),
                BundleDir::PerArch(_) => bail!(
                    "{}: arch directories inside an arch directory",
                    sub.display()
                ),
            }
        }
    };
    notes.push(format!("bundle description: {}", found.display()));
    let root = if same_dir(given, &root) { dir } else { root };
    Ok((found, root))
}

/// Read `--tokens-in`: ids separated by whitespace/commas, or a JSON array of ids.
/// Every problem with the file is a usage error (exit 2), as for the other id lists.
fn read_tokens_in(p: &Path, vocab: usize) -> Result<Vec<u32>> {
    let text = std::fs::read_to_string(p)
        .map_err(|e| usage(format!("--tokens-in {}: cannot read ({e})", p.display())))?;
    let t = text.trim();
    let raw: Vec<String> = if t.starts_with('[') {
        let v: Vec<serde_json::Value> = serde_json::from_str(t).map_err(|e| {
            usage(format!(
                "--tokens-in {}: not a JSON array ({e})",
                p.display()
            ))
        })?;
        v.iter().map(|x| x.to_string()).collect()
    } else {
        t.split(|c: char| c.is_whitespace() || c == ',')
            .filter(|w| !w.is_empty())
            .map(str::to_string)
            .collect()
    };
    if raw.is_empty() {
        bail!(usage(format!(
            "--tokens-in {}: no token ids in the file",
            p.display()
        )));
    }
    raw.iter()
        .enumerate()
        .map(|(i, w)| {
            let id: u64 = w.parse().map_err(|_| {
                usage(format!(
                    "--tokens-in {}: entry {i} ({w:?}) is not a token id",
                    p.display()
                ))
            })?;
            if id >= vocab as u64 {
                bail!(usage(format!(
                    "--tokens-in {}: token id {id} at index {i} is outside the vocabulary (params.vocab {vocab})",
                    p.display()
                )));
            }
            Ok(id as u32)
        })
        .collect()
}

/// Parse `--expect-tokens` / `--teacher-force` (`flag`): a JSON file (an array, or an object
/// with `gold_ids` / `gold_ids_prefix` / `output_ids`) or a comma list of ids. Usage errors.
pub fn parse_ids(spec: &str, flag: &str) -> Result<Vec<u32>> {
    let p = Path::new(spec);
    let ids = if p.is_file() {
        let bytes = std::fs::read(p).with_context(|| format!("{flag}: reading {}", p.display()))?;
        let v: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|e| usage(format!("{flag} {}: not JSON ({e})", p.display())))?;
        let arr = match &v {
            serde_json::Value::Array(_) => Some(&v),
            obj => ["gold_ids", "gold_ids_prefix", "output_ids"]
                .iter()
                .find_map(|k| obj.get(*k)),
        }
        .and_then(|a| a.as_array())
        .ok_or_else(|| {
            usage(format!(
                "{flag} {}: expected an array of ids, or gold_ids / gold_ids_prefix / output_ids",
                p.display()
            ))
        })?;
        arr.iter()
            .map(|x| x.as_u64().and_then(|x| u32::try_from(x).ok()))
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| {
                usage(format!(
                    "{flag} {}: ids must be non-negative integers",
                    p.display()
                ))
            })?
    } else {
        spec.split(',')
            .map(|t| t.trim().parse::<u32>())
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|_| {
                usage(format!(
                    "{flag} {spec:?} is neither a file nor a comma list of ids"
                ))
            })?
    };
    if ids.is_empty() {
        bail!(usage(format!("{flag}: no ids")));
    }
    Ok(ids)
}

/// `-f FILE` / `-f -` (stdin): the whole file is the prompt, one trailing newline dropped.
/// An unreadable file or non-UTF-8 bytes are usage errors, as the same bytes given as the
/// positional prompt are.
fn read_prompt_file(f: &Path) -> Result<String> {
    let name = if f.as_os_str() == "-" {
        "<stdin>".to_string()
    } else {
        f.display().to_string()
    };
    let bytes = if f.as_os_str() == "-" {
        let mut b = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut b)
            .map_err(|e| usage(format!("-f {name}: cannot read ({e})")))?;
        b
    } else {
        std::fs::read(f).map_err(|e| usage(format!("-f {name}: cannot read ({e})")))?
    };
    let mut text = String::from_utf8(bytes).map_err(|e| {
        usage(format!(
            "-f {name}: not valid UTF-8 (first bad byte at offset {}); pass text, or ids with --tokens-in",
            e.utf8_error().valid_up_to()
        ))
    })?;
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    Ok(text)
}

/// First position where `got` differs from `expected` (`got` may be shorter), if any.
pub fn first_mismatch(expected: &[u32], got: &[u32]) -> Option<usize> {
    (0..expected.len()).find(|&i| got.get(i) != Some(&expected[i]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_flags_take_llama_bench_meanings_only_with_bench() {
        let os = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        let a = map_argv(os(&["x", "-p", "hi", "-n", "4", "-sys", "s"]).into_iter());
        assert_eq!(a, os(&["x", "-p", "hi", "-n", "4", "--system", "s"]));
        let b = map_argv(os(&["x", "--bench", "-p", "32,64", "-n", "0", "-r", "3"]).into_iter());
        assert_eq!(
            b,
            os(&[
                "x",
                "--bench",
                "--pp",
                "32,64",
                "--tg",
                "0",
                "--repetitions",
                "3"
            ])
        );
    }

    #[test]
    fn mismatch_positions() {
        assert_eq!(first_mismatch(&[1, 2, 3], &[1, 2, 3, 4]), None);
        assert_eq!(first_mismatch(&[1, 2, 3], &[1, 5, 3]), Some(1));
        assert_eq!(first_mismatch(&[1, 2, 3], &[1, 2]), Some(2));
    }
}
