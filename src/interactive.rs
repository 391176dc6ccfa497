//! `-i`: a multi-turn chat REPL that keeps the KV cache between turns.
//!
//! Each turn renders the whole conversation with the chat template. The transcript (the
//! ids in the cache, plus the last sampled id, which is fed at the start of the next turn)
//! stands for the text "previous render + the reply as decoded". When the new render
//! starts with that text, only the rest is tokenized and fed: the reply keeps the ids the
//! model sampled, as llama.cpp does, even where re-tokenizing its text would merge them
//! differently. When the new render does not extend it (a template that rewrites history,
//! e.g. drops `<think>` blocks), the render is tokenized whole, the cache is rewound to the
//! longest common prefix of the two id sequences and the rest is fed; the turn's stats line
//! says so (`reset=true`).

use crate::chat::{ChatTemplate, Message};
use crate::engine::{Engine, FinishReason, GenConfig, Next};
use crate::error::{Error, Result};
use crate::reasoning::{self, Budget, Filter, Mode};
use crate::tokenizer::Tokenizer;
use std::io::{BufRead, Write};
use std::path::PathBuf;

pub struct Options {
    pub system: Option<String>,
    pub cfg: GenConfig,
    pub reasoning: Mode,
    pub budget: Option<Budget>,
    pub eos: Vec<u32>,
    /// Print each turn's fed ids and pieces on stderr.
    pub verbose_prompt: bool,
    /// Rewrite this JSON file (`messages`, `ids`) after every turn.
    pub transcript: Option<PathBuf>,
}

#[derive(Debug, Default, Clone)]
struct TurnStats {
    prompt: usize,
    cached: usize,
    fed: usize,
    generated: usize,
    reset: bool,
    finish: &'static str,
}

fn out_err(e: std::io::Error) -> Error {
    Error::io("<stdout>", e)
}

/// Run the REPL until EOF on `input`. Assistant text goes to `out`, everything else to
/// stderr.
pub fn run(
    engine: &mut Engine,
    tok: &Tokenizer,
    tmpl: &ChatTemplate,
    opts: &Options,
    input: impl BufRead,
    mut out: impl Write,
) -> Result<()> {
    let max_ctx = engine.max_ctx();
    let mut history: Vec<Message> = Vec::new();
    let mut transcript: Vec<u32> = Vec::new();
    // The text the transcript stands for.
    let mut transcript_text = String::new();
    let mut turns = 0usize;
    let mut last = TurnStats::default();
    engine.reset();
    let mut lines = input.lines();
    loop {
        eprint!("> ");
        let _ = std::io::stderr().flush();
        let Some(line) = lines.next() else {
            eprintln!();
            break;
        };
        let line = line.map_err(|e| Error::io("<stdin>", e))?;
        let line = line.trim_end_matches(['\r', '\n']);
        if line.trim().is_empty() {
            continue;
        }
        match line.trim() {
            "/reset" => {
                engine.reset();
                history.clear();
                transcript.clear();
                transcript_text.clear();
                eprintln!("qhx: conversation reset (context 0/{max_ctx})");
                continue;
            }
            "/stats" => {
                eprintln!(
                    "qhx: stats turns={turns} ctx={}/{max_ctx} last_prompt={} last_cached={} last_fed={} last_generated={} last_finish={}",
                    engine.pos(),
                    last.prompt,
                    last.cached,
                    last.fed,
                    last.generated,
                    if last.finish.is_empty() { "none" } else { last.finish },
                );
                continue;
            }
            _ => {}
        }
        let mut msgs: Vec<Message> = Vec::new();
        if let Some(s) = &opts.system {
            msgs.push(Message::new("system", s));
        }
        msgs.extend(history.iter().cloned());
        msgs.push(Message::new("user", line));
        let full_text = tmpl.render(&msgs, true)?;
        let mut st = TurnStats::default();
        let extends = !transcript.is_empty()
            && full_text.len() > transcript_text.len()
            && full_text.starts_with(&transcript_text);
        let (cached, feed) = if extends {
            let mut f = vec![*transcript.last().expect("non-empty")];
            f.extend(tok.encode_raw(&full_text[transcript_text.len()..])?);
            (engine.pos(), f)
        } else {
            st.reset = !transcript.is_empty();
            let all = tok.encode_raw(&full_text)?;
            // Reuse the longest common prefix; at least one id must be fed.
            let lcp = all
                .iter()
                .zip(&transcript[..engine.pos()])
                .take_while(|(a, b)| a == b)
                .count()
                .min(all.len().saturating_sub(1));
            (lcp, all[lcp..].to_vec())
        };
        let mut full = transcript[..cached].to_vec();
        full.extend_from_slice(&feed);
        st.prompt = full.len();
        let feed = &feed[..];
        if cached + feed.len() >= max_ctx {
            eprintln!(
                "qhx: context full: this turn needs {} positions, {} of max_ctx {max_ctx} are free; /reset starts a new conversation",
                feed.len() + 1,
                max_ctx - cached
            );
            continue;
        }
        if st.reset {
            engine.rewind(cached);
        }
        st.cached = cached;
        st.fed = feed.len();
        if opts.verbose_prompt {
            let pieces: Vec<String> = feed
                .iter()
                .map(|&t| format!("{t}:{:?}", tok.token_to_piece(t)))
                .collect();
            eprintln!("qhx: fed {} ids: {}", feed.len(), pieces.join(" "));
        }
        let cfg = GenConfig {
            n_tokens: opts.cfg.n_tokens.min(max_ctx - cached - feed.len()),
            ..opts.cfg.clone()
        };
        let mut stream = tok.stream();
        let mut filter = Filter::new(opts.reasoning);
        let eos = &opts.eos;
        let ignore_eos = cfg.ignore_eos;
        let o = reasoning::generate(engine, feed, &cfg, 0.0, opts.budget.as_ref(), |t| {
            if ignore_eos || !eos.contains(&t) {
                if let Some(piece) = stream.step(t)? {
                    let shown = filter.push(&piece);
                    out.write_all(shown.as_bytes()).map_err(out_err)?;
                    out.flush().map_err(out_err)?;
                }
            }
            Ok(Next::Continue)
        })?;
        writeln!(out).map_err(out_err)?;
        out.flush().map_err(out_err)?;
        let finish = o.finish_for(cfg.n_tokens, opts.cfg.n_tokens);
        let text_ids = o.text_ids(finish, eos);
        let text = tok.decode(&text_ids)?;
        transcript = full;
        transcript.extend_from_slice(&o.output_ids);
        transcript_text = full_text;
        transcript_text.push_str(&tok.decode(&o.output_ids)?);
        msgs.push(Message::new(
            "assistant",
            reasoning::saved(opts.reasoning, &text),
        ));
        history = msgs.split_off(usize::from(opts.system.is_some()));
        turns += 1;
        st.generated = o.output_ids.len();
        st.finish = finish.as_str();
        eprintln!(
            "qhx: turn={turns} prompt={} cached={} fed={} generated={} ctx={}/{max_ctx} reset={} finish={}",
            st.prompt,
            st.cached,
            st.fed,
            st.generated,
            engine.pos(),
            st.reset,
            st.finish
        );
        if finish == FinishReason::CtxFull {
            eprintln!(
                "qhx: the context is full ({max_ctx} positions); /reset starts a new conversation"
            );
        }
        if let Some(p) = &opts.transcript {
            let doc = serde_json::json!({"messages": history, "ids": transcript});
            std::fs::write(p, format!("{doc}\n")).map_err(|e| Error::io(p, e))?;
        }
        last = st;
    }
    Ok(())
}
