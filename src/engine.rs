//! The token loop: feed the prompt, then pick and feed one token at a time, over a
//! [`Runner`] that executes the bundle's graph plan. The loop knows nothing of the bundle
//! kind; teacher forcing, stop conditions and grammar constraints are drivers on top.
//!
//! Positions are explicit: `pos` is the number of tokens whose K/V sit in the cache, and
//! slot `pos` is the one the next token fills.

use crate::draft::DraftModel;
use crate::error::{Error, Result};
use crate::load::Model;
use crate::plan::Plan;
pub use crate::runner::StepProfile;
use crate::runner::{Clock, Runner};
use crate::sampler;
use crate::speculative::{DraftKind, Governor, Lookahead, SpecConfig, SpecStats};
use crate::stats::Stats;
use serde::Serialize;
use std::sync::Arc;
use std::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    Length,
    Eos,
    Stop,
    CtxFull,
    Cancelled,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Length => "length",
            FinishReason::Eos => "eos",
            FinishReason::Stop => "stop",
            FinishReason::CtxFull => "ctx_full",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

#[derive(Debug, Clone)]
pub struct GenConfig {
    pub n_tokens: usize,
    pub sampler: crate::sampler::SamplerConfig,
    pub allow_nonfinite: bool,
    /// Do not stop at end tokens (parity runs against references that ignore EOS).
    pub ignore_eos: bool,
    /// Teacher forcing: after step k, feed `teacher[k]` instead of the sampled token (the
    /// output ids are still the model's own picks), so each step's top-1 is measured
    /// against a reference continuation. Ends at `teacher.len()` tokens; EOS is ignored.
    pub teacher: Option<Vec<u32>>,
    /// Checked between graph calls; a cancelled run ends with [`FinishReason::Cancelled`].
    pub cancel: crate::cancel::CancelToken,
    /// Speculative decoding: greedy output unchanged, sampled output distributed as
    /// without it, under a grammar too (teacher-forced and `allow_nonfinite` runs decode
    /// plainly).
    pub spec: Option<SpecConfig>,
}

impl GenConfig {
    /// Greedy decoding of `n_tokens`, stopping at end tokens (benchmarks override fields).
    pub fn greedy(n_tokens: usize) -> GenConfig {
        GenConfig {
            n_tokens,
            sampler: crate::sampler::SamplerConfig::default(),
            allow_nonfinite: false,
            ignore_eos: false,
            teacher: None,
            cancel: Default::default(),
            spec: None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Output {
    pub input_ids: Vec<u32>,
    pub output_ids: Vec<u32>,
    pub finish: FinishReason,
    pub stats: Stats,
    /// Speculation counts, when the run speculated.
    pub spec: Option<SpecStats>,
}

impl Output {
    /// Why the run ended, as the user sees it: `Length` becomes `CtxFull` when the context
    /// budget (`allowed` < `requested` tokens), not the request, cut the run short.
    pub fn finish_for(&self, allowed: usize, requested: usize) -> FinishReason {
        if self.finish == FinishReason::Length && allowed < requested {
            FinishReason::CtxFull
        } else {
            self.finish
        }
    }

    /// The generated ids that make up the text: all of them, less the end token when
    /// `finish` is `Eos`.
    pub fn text_ids(&self, finish: FinishReason, eos: &[u32]) -> Vec<u32> {
        let end = |t: &u32| finish == FinishReason::Eos && eos.contains(t);
        self.output_ids
            .iter()
            .copied()
            .filter(|t| !end(t))
            .collect()
    }
}

/// What the caller wants after seeing a token.
pub enum Next {
    Continue,
    Stop(FinishReason),
}

pub struct Engine {
    run: Runner,
    /// End tokens, the context the cache holds, and the load time (for stats).
    eos: Vec<u32>,
    max_ctx: usize,
    load_ms: f64,
    logits: Vec<f32>,
    sampler: crate::sampler::Sampler,
    /// Every token fed or generated since the last reset (for the repetition penalty).
    history: Vec<u32>,
    allow_nonfinite: bool,
    /// Per-component host timing of decode steps, when enabled (set to `Some`).
    pub profile: Option<StepProfile>,
    /// Host bytes a decode step writes into graph inputs, by formula from the descriptors
    /// ([`Plan::decode_bytes_formula`]), not measured: the benchmark reports it to show the
    /// step's host work has no C term.
    pub decode_bytes_formula: usize,
    /// Structured output for the next `generate`: tokens outside the grammar are hidden
    /// before sampling, and each picked token is committed to it. Set by the caller per run.
    pub constraint: Option<crate::grammar::Constraint>,
    /// The draft model of `--spec draft` ([`Engine::set_draft`]).
    draft: Option<DraftModel>,
}

impl Engine {
    /// An engine over a loaded bundle's plan (a manifest bundle's or a Genie bundle's alike).
    pub fn new(m: &Arc<Model>) -> Result<Engine> {
        Engine::for_plan(&m.plan, m.eos.clone(), m.max_ctx, m.load_ms)
    }

    /// Bind the plan's graphs (fails only when the plan cannot be bound, which loading
    /// already checks) and start from an empty cache.
    pub fn for_plan(
        plan: &Arc<Plan>,
        eos: Vec<u32>,
        max_ctx: usize,
        load_ms: f64,
    ) -> Result<Engine> {
        let run = Runner::new(plan)?;
        Ok(Engine {
            eos,
            max_ctx,
            load_ms,
            logits: vec![0.0; plan.vocab],
            sampler: crate::sampler::Sampler::new(Default::default()),
            history: Vec::new(),
            allow_nonfinite: false,
            profile: None,
            decode_bytes_formula: plan.decode_bytes_formula(),
            constraint: None,
            draft: None,
            run,
        })
    }

    /// The draft model `--spec draft` runs drafts on (None: none; a run asking for draft
    /// speculation without one is refused).
    pub fn set_draft(&mut self, draft: Option<DraftModel>) {
        self.draft = draft;
    }

    pub fn has_draft(&self) -> bool {
        self.draft.is_some()
    }

    /// Forget the cache.
    pub fn reset(&mut self) {
        // Only a persistent mask's dtype can fail, and binding the plan checked it.
        let _ = self.run.reset();
        self.history.clear();
    }

    /// True when graph I/O is zero-copy (registered rpcmem buffers).
    pub fn zero_copy(&self) -> bool {
        self.run.zero_copy()
    }

    pub fn pos(&self) -> usize {
        self.run.pos()
    }

    /// Forget cached positions from `pos` on; the next step fills slot `pos`. Rewinding to
    /// 0 is [`Engine::reset`].
    /// A model with recurrent (conv) layers cannot go back: it starts again from 0.
    pub fn rewind(&mut self, pos: usize) {
        if pos < self.run.pos() && self.run.rewind(pos).is_err() {
            let _ = self.run.reset();
            self.history.clear();
            return;
        }
        // Also the last pick of a finished run, which was never fed.
        self.history.truncate(pos);
    }

    /// The ids the cache holds, in order (what a later prompt may share a prefix with).
    pub fn cached(&self) -> &[u32] {
        &self.history[..self.run.pos().min(self.history.len())]
    }

    /// Start the sampler again from its seed: a request with a seed then samples as it would
    /// in a fresh process, whatever ran on this engine before.
    pub fn restart_sampler(&mut self) {
        self.sampler = crate::sampler::Sampler::new(self.sampler.config().clone());
    }

    /// Whether [`Engine::rewind`] keeps the positions before its target (false when layers
    /// carry recurrent state).
    pub fn can_rewind(&self) -> bool {
        self.run.can_rewind()
    }

    /// Positions the cache can hold.
    pub fn max_ctx(&self) -> usize {
        self.max_ctx
    }

    /// Run the prompt, then generate up to `cfg.n_tokens` tokens, calling `on_token` for each
    /// (it may stop the run). `tokenize_ms` is added to the time to first token.
    pub fn generate(
        &mut self,
        ids: &[u32],
        cfg: &GenConfig,
        tokenize_ms: f64,
        mut on_token: impl FnMut(u32) -> Result<Next>,
    ) -> Result<Output> {
        let n = ids.len();
        if n == 0 {
            return Err(Error::EmptyPrompt);
        }
        let pos = self.run.pos();
        if pos + n > self.max_ctx {
            return Err(Error::PromptTooLong {
                tokens: n,
                free: self.max_ctx - pos,
                max_ctx: self.max_ctx,
            });
        }
        let mut stats = Stats {
            prompt_tokens: n,
            load_ms: self.load_ms,
            ..Default::default()
        };
        self.allow_nonfinite = cfg.allow_nonfinite;
        self.run.allow_nonfinite = cfg.allow_nonfinite;
        if self.sampler.config() != &cfg.sampler {
            self.sampler = crate::sampler::Sampler::new(cfg.sampler.clone());
        }
        // The history is what the cache holds plus what is fed now: a finished run's last
        // pick was never fed (a caller that wants it feeds it again).
        self.history.truncate(pos);
        self.history.extend_from_slice(ids);
        let t0 = Instant::now();
        let moves0 = self.run.rung().1;
        let cancel = &cfg.cancel;
        let fed = self.run.feed(ids, &|| cancel.is_cancelled(), None)?;
        if !fed || cancel.is_cancelled() {
            // Cancelled inside the prompt: nothing generated.
            stats.prefill_ms = ms(t0);
            stats.finish();
            return Ok(Output {
                input_ids: ids.to_vec(),
                output_ids: Vec::new(),
                finish: FinishReason::Cancelled,
                stats,
                spec: None,
            });
        }
        let mut tok = self.sample_logits(0, cfg)?;
        stats.prefill_ms = ms(t0);
        stats.ttft_ms = tokenize_ms + stats.prefill_ms;
        let t1 = Instant::now();
        let mut out = Vec::new();
        let mut spec = cfg
            .spec
            .as_ref()
            .filter(|_| self.speculates(cfg))
            .map(|c| (c, SpecStats::new(c), Governor::new(c.adaptive)));
        if spec.as_ref().is_some_and(|s| s.0.kind == DraftKind::Draft) && self.draft.is_none() {
            return Err(Error::Graph {
                graph: "--spec draft".into(),
                msg: "no draft bundle is loaded for this engine".into(),
            });
        }
        let mut ahead = spec
            .as_ref()
            .filter(|s| s.0.kind == DraftKind::Lookahead)
            .map(|s| Lookahead::new(s.0.lookahead));
        let draft_exec0 = self.draft.as_ref().map_or(0, |m| m.executes);
        // A verify emits the tokens it yields itself; the plain path's pick is emitted here.
        let mut emitted = false;
        let finish = 'run: loop {
            if !emitted {
                if let Some(r) = self.emit(tok, &mut out, cfg, &mut on_token, self.run.pos())? {
                    break r;
                }
            }
            emitted = false;
            if let Some((sc, st, gov)) = spec.as_mut() {
                // Drafts beyond what is still wanted would only be undone, and beyond what
                // one verify execute takes here would be cut.
                let mut max = sc.draft_max.min(cfg.n_tokens - out.len() - 1);
                while max > 0 && !self.run.verifies(max + 1) {
                    max -= 1;
                }
                let mut d = match sc.kind {
                    _ if max == 0 => Vec::new(),
                    DraftKind::Lookup => crate::speculative::lookup(&self.history, sc, max),
                    DraftKind::Lookahead => ahead
                        .as_mut()
                        .map_or_else(Vec::new, |l| l.draft(&self.history, max)),
                    DraftKind::Draft => match self.draft.as_mut() {
                        Some(m) => m.draft(&self.history, max, sc.draft_p_min)?,
                        None => Vec::new(),
                    },
                };
                st.refused += self.cut_refused(&mut d)?;
                let drafted = !d.is_empty() && d.len() >= sc.draft_min;
                if drafted && !gov.speculate() {
                    // Not paying now: decode plainly, and score the draft against the picks.
                    st.skipped += 1;
                    gov.shadow(d);
                } else if drafted {
                    let tv = Instant::now();
                    let p = self.run.pos();
                    let mut chunk = Vec::with_capacity(d.len() + 1);
                    chunk.push(tok);
                    chunk.extend_from_slice(&d);
                    self.run.feed(&chunk, &|| false, None)?;
                    st.verifies += 1;
                    st.drafted += d.len();
                    // Row j holds the model's distribution after `tok` and the first j drafts:
                    // greedy, its pick is the next token whatever the draft said; sampled,
                    // the draft is kept with its probability, else the residual is drawn.
                    let mut yielded = 0;
                    let mut picks = Vec::with_capacity(chunk.len());
                    for j in 0..=d.len() {
                        let (a, kept) = self.pick_row(j, d.get(j).copied(), out.len())?;
                        picks.push(a);
                        yielded += 1;
                        st.verify_tokens += 1;
                        st.accepted += usize::from(kept);
                        // Fed so far, as without speculation: `tok` and the first j drafts.
                        let fed = p + 1 + j;
                        if let Some(r) = self.emit(a, &mut out, cfg, &mut on_token, fed)? {
                            let _ = self.run.rewind(fed);
                            break 'run r;
                        }
                        if !kept {
                            if let Some(l) = ahead.as_mut() {
                                // The rows after the rejection: the next Jacobi guesses.
                                for r in j + 1..chunk.len() {
                                    match self.row_argmax(r) {
                                        Some(t) => picks.push(t),
                                        None => break,
                                    }
                                }
                                l.verified(&chunk, &picks, j);
                            }
                            // Rows after a rejected draft: position and mask slots only.
                            let _ = self.run.rewind(fed);
                            tok = a;
                            emitted = true;
                            break;
                        }
                    }
                    if gov.verified(yielded, ms(tv)) {
                        st.switched_off += 1;
                    }
                    continue;
                }
                st.plain += 1;
            }
            let fed = cfg
                .teacher
                .as_ref()
                .and_then(|t| t.get(out.len() - 1))
                .copied()
                .unwrap_or(tok);
            if cfg.teacher.is_some() {
                // The history (repetition penalty) follows what was fed, not what was picked.
                if let Some(last) = self.history.last_mut() {
                    *last = fed;
                }
            }
            let td = Instant::now();
            self.run.feed(&[fed], &|| false, self.profile.as_mut())?;
            tok = self.sample_logits(out.len(), cfg)?;
            if let Some((_, _, gov)) = spec.as_mut() {
                gov.decoded(ms(td));
                gov.picked(tok);
            }
            if let Some(l) = ahead.as_mut() {
                l.decoded();
            }
            if let Some(p) = &mut self.profile {
                p.steps += 1;
            }
        };
        stats.decode_ms = ms(t1);
        stats.generated_tokens = out.len();
        (stats.ctx_rung, stats.rung_moves) = self.run.rung();
        stats.rung_moves -= moves0.min(stats.rung_moves);
        stats.finish();
        Ok(Output {
            input_ids: ids.to_vec(),
            output_ids: out,
            finish,
            stats,
            spec: spec.map(|(_, mut st, gov)| {
                gov.report(&mut st);
                st.pool = ahead.as_ref().map(Lookahead::pool_len);
                st.draft_executes = self.draft.as_ref().map(|m| m.executes - draft_exec0);
                st.finish();
                st
            }),
        })
    }

    /// Speculation keeps greedy output unchanged and sampled output distributed as
    /// without it, under a grammar too (each row is picked under the grammar's mask);
    /// teacher forcing (it changes what is fed) and `--allow-nonfinite` run without it.
    fn speculates(&self, cfg: &GenConfig) -> bool {
        cfg.teacher.is_none() && !cfg.allow_nonfinite
    }

    /// Under a grammar, cut the draft before its first token the grammar refuses (given
    /// the drafts before it): that row's masked pick could never keep it, so feeding it
    /// and what follows would only spend rows. Returns how many tokens were cut.
    fn cut_refused(&mut self, d: &mut Vec<u32>) -> Result<usize> {
        let Some(c) = &mut self.constraint else {
            return Ok(0);
        };
        let n = c.admits(d)?;
        let cut = d.len() - n;
        d.truncate(n);
        Ok(cut)
    }

    /// Take a generated token: the end checks of every step, in the order the plain loop
    /// has them. `fed` is how many tokens sit in the cache before `tok` would be fed.
    fn emit(
        &self,
        tok: u32,
        out: &mut Vec<u32>,
        cfg: &GenConfig,
        on_token: &mut impl FnMut(u32) -> Result<Next>,
        fed: usize,
    ) -> Result<Option<FinishReason>> {
        out.push(tok);
        // A grammar's end is always the end (it allows nothing but the end token then).
        let eos_ends = (!cfg.ignore_eos || self.constraint.is_some()) && cfg.teacher.is_none();
        if eos_ends && self.eos.contains(&tok) {
            return Ok(Some(FinishReason::Eos));
        }
        if let Next::Stop(r) = on_token(tok)? {
            return Ok(Some(r));
        }
        if out.len() >= cfg.n_tokens {
            return Ok(Some(FinishReason::Length));
        }
        if fed >= self.max_ctx {
            return Ok(Some(FinishReason::CtxFull));
        }
        if cfg.cancel.is_cancelled() {
            return Ok(Some(FinishReason::Cancelled));
        }
        Ok(None)
    }

    /// The pick from row `j` of the last execute (a verify), checked finite, and whether
    /// it keeps `draft`: greedy, the argmax (kept when it is the draft); sampled, the
    /// chain's acceptance of the draft or, past the drafts, a plain draw. Under a grammar
    /// the row is masked first and its pick committed, as a plain constrained step does:
    /// the rows before it kept their drafts, so the grammar's state is the row's own.
    fn pick_row(&mut self, j: usize, draft: Option<u32>, step: usize) -> Result<(u32, bool)> {
        let c = self.sampler.config();
        let greedy = c.is_greedy() && c.repeat_penalty == 1.0 && self.constraint.is_none();
        if greedy {
            // A verify head that takes the argmax in the graph: no logits cross to the host.
            if let Some(t) = self.run.row_pick(j)? {
                self.history.push(t);
                return Ok((t, draft == Some(t)));
            }
        }
        let view = self.run.row_logits(j)?;
        view.read_f32(0, &mut self.logits);
        let picked = if greedy {
            let t =
                sampler::argmax_checked(&self.logits).map_err(|_| self.nonfinite_logits(step))?;
            (t, draft == Some(t))
        } else {
            if sampler::first_non_finite(&self.logits).is_some() {
                return Err(self.nonfinite_logits(step));
            }
            if let Some(g) = &mut self.constraint {
                g.apply(&mut self.logits)?;
            }
            self.sampler.apply(&mut self.logits, &self.history);
            let picked = match draft {
                Some(d) => self.sampler.accept_or_resample(d),
                None => (self.sampler.select(), false),
            };
            if let Some(g) = &mut self.constraint {
                g.commit(picked.0)?;
            }
            picked
        };
        self.history.push(picked.0);
        Ok(picked)
    }

    /// The greedy pick of row `j` of the last execute, for lookahead's guesses only (never
    /// emitted): None when its logits cannot be read or are not finite.
    fn row_argmax(&mut self, j: usize) -> Option<u32> {
        if let Ok(Some(t)) = self.run.row_pick(j) {
            return Some(t);
        }
        let view = self.run.row_logits(j).ok()?;
        view.read_f32(0, &mut self.logits);
        sampler::argmax_checked(&self.logits).ok()
    }

    /// Read the last token's logits (running the head graph when the plan has one) and
    /// pick the next token.
    fn sample_logits(&mut self, step: usize, cfg: &GenConfig) -> Result<u32> {
        let mut clock = Clock::new(self.profile.is_some());
        let check = !(cfg.allow_nonfinite || self.allow_nonfinite);
        let plain_greedy = self.sampler.config().is_greedy()
            && self.sampler.config().repeat_penalty == 1.0
            && self.constraint.is_none();
        let view = self.run.logits()?;
        let t_exec = clock.lap();
        // Greedy over f16 logits needs no f32 copy: argmax on the f16 bits, finiteness fused.
        if plain_greedy && check {
            if let crate::ops::convert::Typed::F16(h) = view {
                let picked = sampler::argmax_f16_checked(h);
                if let Some(pr) = &mut self.profile {
                    pr.execute_ns += t_exec;
                    pr.sampling_ns += clock.lap();
                }
                let tok = picked.map_err(|_| self.nonfinite_logits(step))?;
                self.history.push(tok);
                return Ok(tok);
            }
        }
        view.read_f32(0, &mut self.logits);
        let t_read = clock.lap();
        let tok = if plain_greedy && check {
            sampler::argmax_checked(&self.logits).map_err(|_| self.nonfinite_logits(step))?
        } else {
            if check && sampler::first_non_finite(&self.logits).is_some() {
                return Err(self.nonfinite_logits(step));
            }
            if let Some(c) = &mut self.constraint {
                c.apply(&mut self.logits)?;
            }
            let tok = self.sampler.sample(&mut self.logits, &self.history);
            if let Some(c) = &mut self.constraint {
                c.commit(tok)?;
            }
            tok
        };
        if let Some(pr) = &mut self.profile {
            pr.execute_ns += t_exec;
            pr.lmhead_read_ns += t_read;
            pr.sampling_ns += clock.lap();
        }
        self.history.push(tok);
        Ok(tok)
    }

    fn nonfinite_logits(&self, step: usize) -> Error {
        Error::NonFinite {
            what: "logits",
            step,
            pos: self.run.pos().saturating_sub(1),
            graph: self.run.logits_graph(),
            hint: " — fp16 overflow in the graph is the usual cause (see the seed bundle notes); --allow-nonfinite continues anyway",
        }
    }
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

// A session may be handed to another thread (the C API, a server's worker pool): keep it
// `Send`. The model it shares must be `Send + Sync`.
const _: () = {
    const fn send<T: Send>() {}
    const fn shared<T: Send + Sync>() {}
    send::<Engine>();
    shared::<Model>();
};
