//! A loaded bundle and one engine over it, with the one place a request is composed: the
//! prompt (raw ids, text with the bundle's BOS, or chat messages through the template with
//! tool declarations and the thinking switch), the room it leaves in the context, the stop
//! strings (the request's, else the bundle's) and the text options. `qhx_generate`, the C
//! API and the server all drive a `Session`, so a request means the same thing in each.

use crate::bundle::Spec;
use crate::chat::{ChatTemplate, Message};
use crate::engine::{Engine, GenConfig};
use crate::error::{Error, Result};
use crate::grammar;
use crate::load::Loaded;
use crate::reasoning;
use crate::text::{TextDriver, TextOptions, TextSink, TextTurn};
use crate::tokenizer::Tokenizer;
use crate::tools::Tools;

/// What the model is given.
#[derive(Debug, Clone)]
pub enum Prompt {
    /// Token ids, fed as they are.
    Ids(Vec<u32>),
    /// Raw text, with the bundle's BOS before it.
    Text(String),
    /// Messages through the chat template.
    Chat(Chat),
}

/// A chat request's messages and what shapes their rendering.
#[derive(Debug, Clone, Default)]
pub struct Chat {
    pub messages: Vec<Message>,
    /// Tools declared to the template (or in a system message when it reads none).
    pub tools: Option<Tools>,
    /// `enable_thinking = false` to the template, and a block the template still opens is
    /// closed empty before the answer (hard non-thinking).
    pub no_thinking: bool,
}

/// The chat template applied to `chat`, with the generation prompt opened: the one rendering
/// every front end uses (before the load too, to count a prompt with the spec's template).
pub fn render_chat(tmpl: &ChatTemplate, chat: &Chat) -> Result<String> {
    let thinking = chat.no_thinking.then_some(false);
    let mut text = crate::tools::render(tmpl, &chat.messages, chat.tools.as_ref(), thinking)?;
    if chat.no_thinking && reasoning::opens_block(&text) {
        text.push_str("\n\n");
        text.push_str(reasoning::THINK_CLOSE);
        text.push_str("\n\n");
    }
    Ok(text)
}

/// The ids of `prompt` with tokenizer `tok`: chat through the template `tmpl` gives (read
/// only for a chat prompt), text after `bos`.
pub fn encode(
    prompt: &Prompt,
    tmpl: impl FnOnce() -> Result<ChatTemplate>,
    tok: &Tokenizer,
    bos: Option<u32>,
) -> Result<Vec<u32>> {
    match prompt {
        Prompt::Ids(v) => Ok(v.clone()),
        Prompt::Text(t) => tok.encode(t, bos),
        Prompt::Chat(c) => tok.encode_raw(&render_chat(&tmpl()?, c)?),
    }
}

/// Positions left to generate after a prompt of `prompt_len` ids in a fresh context of
/// `max_ctx`; a prompt that leaves none is an error.
pub fn room(prompt_len: usize, max_ctx: usize) -> Result<usize> {
    if prompt_len >= max_ctx {
        return Err(Error::NoRoom {
            tokens: prompt_len,
            max_ctx,
        });
    }
    Ok(max_ctx - prompt_len)
}

/// The speculation a run uses: what was asked for, else what the bundle asks for (a Genie
/// `lade` dialog runs lookahead with its values), with a note saying so.
pub fn spec_or_bundle(
    requested: Option<crate::speculative::SpecConfig>,
    spec: &Spec,
) -> (Option<crate::speculative::SpecConfig>, Option<String>) {
    use crate::speculative::{DraftKind, SpecConfig};
    match (requested, spec.lookahead()) {
        (Some(r), _) => (Some(r), None),
        (None, Some(la)) => {
            let c = la.config;
            let mut note = format!(
                "lookahead decoding as {} asks (dialog.type \"lade\": window {}, ngram {}, gcap {})",
                spec.path.display(),
                c.window,
                c.ngram,
                c.gcap
            );
            if let Some(m) = la.update_mode.as_deref().filter(|m| *m != "FWD_MAX_HIT") {
                note.push_str(&format!(
                    "; update-mode {m} runs as FWD_MAX_HIT (the window moves by the hits; output is the same)"
                ));
            }
            let sc = SpecConfig {
                lookahead: c,
                ..SpecConfig::of(DraftKind::Lookahead)
            };
            (Some(sc), Some(note))
        }
        (None, None) => (None, None),
    }
}

/// The request's stop strings, else the ones the bundle declares (Genie's stop-sequence).
pub fn stops_or_bundle(requested: &[String], spec: &Spec) -> Vec<String> {
    if requested.is_empty() {
        spec.stops()
    } else {
        requested.to_vec()
    }
}

/// How a turn's text is handled: stops, reasoning, its budget and a grammar.
#[derive(Debug, Clone, Default)]
pub struct TextRequest {
    /// Stop strings; empty: the bundle's own.
    pub stops: Vec<String>,
    pub reasoning: reasoning::Mode,
    /// At most this many tokens inside a think block (then it is closed).
    pub reasoning_budget: Option<usize>,
    pub grammar: Option<(std::sync::Arc<grammar::Vocab>, grammar::Spec)>,
}

/// A loaded bundle, its description and an engine over it.
pub struct Session {
    spec: std::sync::Arc<Spec>,
    loaded: Loaded,
    engine: Engine,
    /// The chat template, read once (None: the bundle has none; chat requests then fail).
    template: Option<ChatTemplate>,
}

impl Session {
    /// An engine over `loaded`, which `spec` describes.
    pub fn new(spec: std::sync::Arc<Spec>, loaded: Loaded) -> Result<Session> {
        let engine = Engine::new(loaded.model())?;
        let template = spec.chat_template(Some(loaded.tokenizer())).ok();
        Ok(Session {
            spec,
            loaded,
            engine,
            template,
        })
    }

    pub fn spec(&self) -> &Spec {
        &self.spec
    }

    /// Load the draft bundle `--spec draft BUNDLE` names (none for other modes) onto this
    /// session's backend and draft with it from now on.
    pub fn attach_draft(
        &mut self,
        spec: Option<&crate::speculative::SpecConfig>,
        opts: &crate::load::LoadOptions,
    ) -> Result<()> {
        let Some(path) = spec.and_then(|s| s.draft_bundle.as_deref()) else {
            return Ok(());
        };
        let d = crate::draft::DraftModel::load(path, &self.loaded, opts)?;
        self.engine.set_draft(Some(d));
        Ok(())
    }

    pub fn loaded(&self) -> &Loaded {
        &self.loaded
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        self.loaded.tokenizer()
    }

    /// The engine, for runs that are not one text turn (bench, `-i`).
    pub fn engine(&mut self) -> &mut Engine {
        &mut self.engine
    }

    /// The chat template (an error naming where qhx looked when the bundle has none).
    pub fn template(&self) -> Result<ChatTemplate> {
        match &self.template {
            Some(t) => Ok(t.clone()),
            None => self.spec.chat_template(Some(self.loaded.tokenizer())),
        }
    }

    /// The prompt's ids.
    pub fn prompt_ids(&self, prompt: &Prompt) -> Result<Vec<u32>> {
        encode(
            prompt,
            || self.template(),
            self.loaded.tokenizer(),
            self.spec.bos(),
        )
    }

    /// The text options of a request, with its think-block budget in this tokenizer's ids.
    pub fn text_options(&self, req: &TextRequest) -> Result<TextOptions> {
        let tok = self.loaded.tokenizer();
        let budget = match req.reasoning_budget {
            Some(max) => Some(reasoning::Budget {
                max,
                open: tok.encode_raw(reasoning::THINK_OPEN)?,
                close: tok.encode_raw(reasoning::THINK_CLOSE)?,
            }),
            None => None,
        };
        Ok(TextOptions {
            stops: stops_or_bundle(&req.stops, &self.spec),
            reasoning: req.reasoning,
            budget,
            grammar: req.grammar.clone(),
        })
    }

    /// One turn from a fresh cache: `ids` (from [`Session::prompt_ids`]), up to `requested`
    /// tokens (clamped to the room the prompt leaves: `cfg.n_tokens` is set here), text to
    /// `sink` as it is decided.
    pub fn generate(
        &mut self,
        ids: &[u32],
        cfg: &GenConfig,
        requested: usize,
        text: &TextRequest,
        tokenize_ms: f64,
        sink: Option<&mut dyn TextSink>,
    ) -> Result<TextTurn> {
        self.generate_reusing(false, ids, cfg, requested, text, tokenize_ms, sink)
            .map(|(turn, _)| turn)
    }

    /// [`Session::generate`], keeping (when `reuse`) the longest prefix of `ids` that the
    /// cache already holds from this session's last turn (a conversation's earlier turns, as
    /// llama-server's prompt cache): only the rest is fed. Gives the same tokens as a
    /// fresh turn. Returns the turn and how many prompt ids were kept.
    #[allow(clippy::too_many_arguments)]
    pub fn generate_reusing(
        &mut self,
        reuse: bool,
        ids: &[u32],
        cfg: &GenConfig,
        requested: usize,
        text: &TextRequest,
        tokenize_ms: f64,
        sink: Option<&mut dyn TextSink>,
    ) -> Result<(TextTurn, usize)> {
        let room = room(ids.len(), self.loaded.max_ctx())?;
        let cfg = GenConfig {
            n_tokens: requested.min(room),
            ..cfg.clone()
        };
        let eos = self.loaded.eos();
        let driver = TextDriver::new(self.loaded.tokenizer(), &eos, self.text_options(text)?);
        // One id at least is fed: its logits pick the first token.
        let kept = if reuse && self.engine.can_rewind() {
            common_prefix(self.engine.cached(), ids).min(ids.len().saturating_sub(1))
        } else {
            0
        };
        if kept == 0 {
            self.engine.reset();
        } else {
            self.engine.rewind(kept);
        }
        self.engine.restart_sampler();
        let turn = driver.generate_after(
            &mut self.engine,
            ids,
            kept,
            &cfg,
            requested,
            tokenize_ms,
            sink,
        )?;
        Ok((turn, kept))
    }

    /// The ids this session's cache holds (its last turn's prompt and reply).
    pub fn cached(&self) -> &[u32] {
        self.engine.cached()
    }

    /// Clear the cache (the next turn starts fresh).
    pub fn reset(&mut self) {
        self.engine.reset();
    }
}

/// How many leading ids `a` and `b` share.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
