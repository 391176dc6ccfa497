//! The token loop over the prefill, decode and lm-head graphs.
//!
//! Positions are explicit: `pos` is the number of tokens whose K/V sit in the decode cache,
//! and slot `pos` is the one the next decode step fills. Per decode step the host writes one
//! embedding row, one RoPE row, one mask slot and one K/V row per layer: O(H + K·L), never
//! O(C).

use crate::error::{Error, Result};
use crate::genie::{GenieModel, GenieRunner};
use crate::kv::copy_rows;
use crate::model::{LayerStackGraph, Model};
use crate::ops::{mask, rope::RopeTable};
use crate::qnn::{Binding, PairedBindings};
use crate::sampler;
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
        }
    }
}

/// Host time per component of the decode steps run while profiling was on, in nanoseconds
/// (sums; divide by `steps`). graphExecute time is kept apart: on a device it is NPU time.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StepProfile {
    pub steps: u64,
    pub embed_ns: u64,
    pub rope_ns: u64,
    pub mask_ns: u64,
    pub kv_write_ns: u64,
    /// Decode output `y` read and lm-head input write (dtype conversions).
    pub io_convert_ns: u64,
    pub lmhead_read_ns: u64,
    pub sampling_ns: u64,
    pub execute_ns: u64,
}

impl StepProfile {
    /// (name, ms per step) of every host component, in table order.
    pub fn components_ms(&self) -> Vec<(&'static str, f64)> {
        let n = self.steps.max(1) as f64;
        let ms = |ns: u64| ns as f64 / n / 1e6;
        vec![
            ("embed", ms(self.embed_ns)),
            ("rope", ms(self.rope_ns)),
            ("mask", ms(self.mask_ns)),
            ("kv_write", ms(self.kv_write_ns)),
            ("io_convert", ms(self.io_convert_ns)),
            ("lmhead_read", ms(self.lmhead_read_ns)),
            ("sampling", ms(self.sampling_ns)),
        ]
    }
}

#[derive(Debug, Clone)]
pub struct Output {
    pub input_ids: Vec<u32>,
    pub output_ids: Vec<u32>,
    pub finish: FinishReason,
    pub stats: Stats,
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
    graphs: Graphs,
    /// End tokens, the context the cache holds, and the load time (for stats).
    eos: Vec<u32>,
    max_ctx: usize,
    load_ms: f64,
    logits: Vec<f32>,
    sampler: crate::sampler::Sampler,
    /// Every token fed or generated since the last reset (for the repetition penalty).
    history: Vec<u32>,
    scratch: Vec<f32>,
    /// Tokens whose K/V are in the cache.
    pos: usize,
    allow_nonfinite: bool,
    /// Per-component host timing of decode steps, when enabled (set to `Some`).
    pub profile: Option<StepProfile>,
    /// Host bytes a decode step writes into graph inputs, by formula from the descriptors
    /// ([`Model::decode_bytes_formula`]; 0 for Genie bundles), not measured: the benchmark
    /// reports it to show the step's host work has no C term.
    pub decode_bytes_formula: usize,
    /// Structured output for the next `generate`: tokens outside the grammar are hidden
    /// before sampling, and each picked token is committed to it. Set by the caller per run.
    pub constraint: Option<crate::grammar::Constraint>,
}

/// The graph side of the loop: a manifest bundle's prefill / decode / lm-head graphs, or a
/// Genie bundle's variants (see [`crate::genie`]).
enum Graphs {
    Bundle(Box<BundleGraphs>),
    Genie(Box<GenieRunner>),
}

struct BundleGraphs {
    m: Arc<Model>,
    rope: RopeTable,
    /// Prefill and decode bindings; a chunked prefill's past inputs share the decode cache.
    bind: PairedBindings,
    lm: Binding,
    hidden: Vec<f32>,
}

impl Engine {
    /// Build the bindings (fails only if a chunked prefill's past inputs cannot share the
    /// decode cache, which model loading already checks).
    pub fn new(m: &Arc<Model>) -> Result<Engine> {
        let p = &m.manifest.params;
        let prefill_rows = m.prefill.as_ref().map_or(0, |p| p.io.rows);
        // A chunk at the last cache slots still reads P rows of the table.
        let positions = m.max_ctx + prefill_rows;
        let shared: Vec<(usize, usize)> = match &m.prefill {
            Some(pre) if pre.io.ctx > 0 => pre
                .io
                .past
                .iter()
                .zip(&m.decode.io.past)
                .flat_map(|(&(pk, pv), &(dk, dv))| [(pk, dk), (pv, dv)])
                .collect(),
            _ => Vec::new(),
        };
        // Every graph's I/O is bound once (rpcmem + memRegister when the runtime has rpcmem).
        let bind = PairedBindings::new(
            m.prefill.as_ref().map(|p| (&p.graph, &p.desc)),
            (&m.decode.graph, &m.decode.desc),
            &shared,
        )?;
        let rope = RopeTable::new(p.rope_theta, p.head_dim, positions, p.rope_scaling.as_ref());
        let formula = m.decode_bytes_formula;
        let lm = Binding::for_graph(&m.lmhead.graph, &m.lmhead.desc)?;
        let (eos, max_ctx, load_ms, vocab) = (m.eos.clone(), m.max_ctx, m.load_ms, p.vocab);
        let graphs = Graphs::Bundle(Box::new(BundleGraphs {
            m: Arc::clone(m),
            rope,
            bind,
            lm,
            hidden: vec![0.0; p.hidden],
        }));
        let mut e = Engine::with(graphs, eos, max_ctx, load_ms, vocab);
        e.decode_bytes_formula = formula;
        Ok(e)
    }

    /// An engine over a Genie bundle's graphs.
    pub fn genie(g: &Arc<GenieModel>) -> Result<Engine> {
        let graphs = Graphs::Genie(Box::new(GenieRunner::new(g)?));
        Ok(Engine::with(
            graphs,
            g.eos(),
            g.max_ctx(),
            g.load_ms,
            g.vocab,
        ))
    }

    fn with(graphs: Graphs, eos: Vec<u32>, max_ctx: usize, load_ms: f64, vocab: usize) -> Self {
        let mut e = Engine {
            graphs,
            eos,
            max_ctx,
            load_ms,
            logits: vec![0.0; vocab],
            sampler: crate::sampler::Sampler::new(Default::default()),
            history: Vec::new(),
            scratch: Vec::new(),
            pos: 0,
            allow_nonfinite: false,
            profile: None,
            decode_bytes_formula: 0,
            constraint: None,
        };
        e.reset();
        e
    }

    /// Forget the cache: every mask slot hidden.
    pub fn reset(&mut self) {
        match &mut self.graphs {
            Graphs::Bundle(q) => {
                let io = &q.m.decode.io;
                let mut mk = q.bind.dec().input_mut(io.mask);
                let neg = mk.mask_neg();
                let n = mk.len();
                mk.fill(0, n, neg);
            }
            Graphs::Genie(g) => g.reset(),
        }
        self.pos = 0;
        self.history.clear();
    }

    /// True when graph I/O is zero-copy (registered rpcmem buffers).
    pub fn zero_copy(&self) -> bool {
        match &self.graphs {
            Graphs::Bundle(q) => q.bind.dec_ref().is_shared() && q.lm.is_shared(),
            Graphs::Genie(g) => g.zero_copy(),
        }
    }

    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Forget cached positions from `pos` on (their mask slots hidden again); the next
    /// step fills slot `pos`. Rewinding to 0 is [`Engine::reset`].
    pub fn rewind(&mut self, pos: usize) {
        if pos >= self.pos {
            return;
        }
        match &mut self.graphs {
            Graphs::Bundle(q) => {
                let io = &q.m.decode.io;
                let mut mk = q.bind.dec().input_mut(io.mask);
                let neg = mk.mask_neg();
                mk.fill(pos, self.pos - pos, neg);
            }
            Graphs::Genie(g) => g.rewind(pos),
        }
        self.pos = pos;
        self.history.truncate(pos);
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
        if self.pos + n > self.max_ctx {
            return Err(Error::PromptTooLong {
                tokens: n,
                free: self.max_ctx - self.pos,
                max_ctx: self.max_ctx,
            });
        }
        let mut stats = Stats {
            prompt_tokens: n,
            load_ms: self.load_ms,
            ..Default::default()
        };
        self.allow_nonfinite = cfg.allow_nonfinite;
        if self.sampler.config() != &cfg.sampler {
            self.sampler = crate::sampler::Sampler::new(cfg.sampler.clone());
        }
        self.history.extend_from_slice(ids);
        let t0 = Instant::now();
        if !self.run_prompt(ids, &cfg.cancel)? {
            // Cancelled inside the prompt: nothing generated.
            stats.prefill_ms = ms(t0);
            stats.finish();
            return Ok(Output {
                input_ids: ids.to_vec(),
                output_ids: Vec::new(),
                finish: FinishReason::Cancelled,
                stats,
            });
        }
        let mut tok = self.sample_logits(0, cfg)?;
        stats.prefill_ms = ms(t0);
        stats.ttft_ms = tokenize_ms + stats.prefill_ms;
        let t1 = Instant::now();
        let mut out = Vec::new();
        let finish = loop {
            out.push(tok);
            // A grammar's end is always the end (it allows nothing but the end token then).
            let eos_ends = (!cfg.ignore_eos || self.constraint.is_some()) && cfg.teacher.is_none();
            if eos_ends && self.eos.contains(&tok) {
                break FinishReason::Eos;
            }
            if let Next::Stop(r) = on_token(tok)? {
                break r;
            }
            if out.len() >= cfg.n_tokens {
                break FinishReason::Length;
            }
            if self.pos >= self.max_ctx {
                break FinishReason::CtxFull;
            }
            if cfg.cancel.is_cancelled() {
                break FinishReason::Cancelled;
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
            self.decode_step(fed)?;
            tok = self.sample_logits(out.len(), cfg)?;
            if let Some(p) = &mut self.profile {
                p.steps += 1;
            }
        };
        stats.decode_ms = ms(t1);
        stats.generated_tokens = out.len();
        stats.finish();
        Ok(Output {
            input_ids: ids.to_vec(),
            output_ids: out,
            finish,
            stats,
        })
    }

    /// Put the prompt into the cache and leave its last hidden state in the lm-head input.
    /// Returns false when `cancel` fired between graph calls.
    ///
    /// A prefill graph without past inputs takes the first P tokens of an empty cache; one
    /// with past inputs (chunked prefill) takes the prompt in chunks of up to P from any
    /// position. Whatever is left goes through the decode graph token by token.
    fn run_prompt(&mut self, ids: &[u32], cancel: &crate::cancel::CancelToken) -> Result<bool> {
        let m = match &mut self.graphs {
            Graphs::Genie(g) => {
                g.allow_nonfinite = self.allow_nonfinite;
                let go = g.feed(ids, &|| cancel.is_cancelled())?;
                self.pos = g.pos();
                return Ok(go && !cancel.is_cancelled());
            }
            Graphs::Bundle(q) => Arc::clone(&q.m),
        };
        let mut i = 0;
        if let Some(pre) = &m.prefill {
            let io = &pre.io;
            if io.ctx == 0 {
                if self.pos == 0 {
                    let c = ids.len().min(io.rows);
                    self.prefill_chunk(&ids[..c], pre)?;
                    i = c;
                }
            } else {
                // A chunk may only run while all its P rows fit in the cache.
                while i < ids.len() && self.pos + io.rows <= io.ctx {
                    if cancel.is_cancelled() {
                        return Ok(false);
                    }
                    let c = (ids.len() - i).min(io.rows);
                    self.prefill_chunk(&ids[i..i + c], pre)?;
                    i += c;
                }
            }
        }
        for &t in &ids[i..] {
            if cancel.is_cancelled() {
                return Ok(false);
            }
            self.decode_step(t)?;
        }
        Ok(!cancel.is_cancelled())
    }

    /// One prefill execute over `chunk` (at most P tokens) at position `self.pos`.
    fn prefill_chunk(&mut self, chunk: &[u32], g: &LayerStackGraph) -> Result<()> {
        let Graphs::Bundle(q) = &mut self.graphs else {
            unreachable!("prefill graphs belong to manifest bundles")
        };
        let m = Arc::clone(&q.m);
        let io = &g.io;
        let p = &m.manifest.params;
        let (h, rows, pos0) = (p.hidden, io.rows, self.pos);
        let (pre, dec) = q.bind.both();
        let pre = pre.expect("prefill binding exists with a prefill graph");
        {
            let mut x = pre.input_mut(io.x);
            for (r, &t) in chunk.iter().enumerate() {
                m.embed.write_row(t, &mut x, r * h)?;
            }
            x.fill(chunk.len() * h, (rows - chunk.len()) * h, 0.0);
        }
        pre.input_mut(io.cos)
            .write_f32(0, q.rope.cos_rows(pos0, rows));
        pre.input_mut(io.sin)
            .write_f32(0, q.rope.sin_rows(pos0, rows));
        {
            let mut mk = pre.input_mut(io.mask);
            let neg = mk.mask_neg();
            mk.write_f32(0, &mask::prefill_causal(rows, io.ctx, pos0, neg));
        }
        // With past inputs the graph reads the decode cache in place (shared buffers).
        g.graph.execute(pre)?;
        // The chunk's K/V rows go into the cache at pos0.., and their mask slots open.
        let dio = &m.decode.io;
        let dshape = dio.past_shape.expect("decode graphs have past inputs");
        for (l, &(nk, nv)) in io.new.iter().enumerate() {
            let (pk, pv) = dio.past[l];
            for (o, i) in [(nk, pk), (nv, pv)] {
                copy_rows(
                    (&pre.output(o), &io.new_shape, 0),
                    (&mut dec.input_mut(i), &dshape, pos0),
                    chunk.len(),
                    &mut self.scratch,
                );
            }
        }
        dec.input_mut(dio.mask).fill(pos0, chunk.len(), 0.0);
        // The last real row's hidden state goes to the lm-head.
        let last = chunk.len() - 1;
        pre.output(io.y).read_f32(last * h, &mut q.hidden);
        check_finite_hidden(
            &q.hidden,
            self.allow_nonfinite,
            &g.desc.name,
            0,
            pos0 + last,
        )?;
        q.lm.input_mut(0).write_f32(0, &q.hidden);
        self.pos = pos0 + chunk.len();
        Ok(())
    }

    /// Run the decode graph for `token` at position `self.pos`, then store its K/V.
    fn decode_step(&mut self, token: u32) -> Result<()> {
        let q = match &mut self.graphs {
            Graphs::Genie(g) => {
                g.allow_nonfinite = self.allow_nonfinite;
                g.feed(&[token], &|| false)?;
                self.pos = g.pos();
                return Ok(());
            }
            Graphs::Bundle(q) => q,
        };
        let m = Arc::clone(&q.m);
        let (g, io) = (&m.decode, &m.decode.io);
        let p = self.pos;
        let dshape = io.past_shape.expect("decode graphs have past inputs");
        let mut clock = Clock::new(self.profile.is_some());
        let dec = q.bind.dec();
        {
            let mut x = dec.input_mut(io.x);
            m.embed.write_row(token, &mut x, 0)?;
        }
        let t_embed = clock.lap();
        dec.input_mut(io.cos).write_f32(0, q.rope.cos(p));
        dec.input_mut(io.sin).write_f32(0, q.rope.sin(p));
        let t_rope = clock.lap();
        g.graph.execute(dec)?;
        let t_exec = clock.lap();
        for (l, &(nk, nv)) in io.new.iter().enumerate() {
            let (pk, pv) = io.past[l];
            for (o, i) in [(nk, pk), (nv, pv)] {
                let (src, mut dst) = dec.output_and_input_mut(o, i);
                copy_rows(
                    (&src, &io.new_shape, 0),
                    (&mut dst, &dshape, p),
                    1,
                    &mut self.scratch,
                );
            }
        }
        let t_kv = clock.lap();
        dec.input_mut(io.mask).fill(p, 1, 0.0);
        let t_mask = clock.lap();
        dec.output(io.y).read_f32(0, &mut q.hidden);
        check_finite_hidden(&q.hidden, self.allow_nonfinite, &g.desc.name, p, p)?;
        q.lm.input_mut(0).write_f32(0, &q.hidden);
        let t_io = clock.lap();
        if let Some(pr) = &mut self.profile {
            pr.embed_ns += t_embed;
            pr.rope_ns += t_rope;
            pr.execute_ns += t_exec;
            pr.kv_write_ns += t_kv;
            pr.mask_ns += t_mask;
            pr.io_convert_ns += t_io;
        }
        self.pos = p + 1;
        Ok(())
    }

    /// Execute the lm-head on its current input and pick the next token.
    fn sample_logits(&mut self, step: usize, cfg: &GenConfig) -> Result<u32> {
        let mut clock = Clock::new(self.profile.is_some());
        let check = !(cfg.allow_nonfinite || self.allow_nonfinite);
        let plain_greedy = self.sampler.config().is_greedy()
            && self.sampler.config().repeat_penalty == 1.0
            && self.constraint.is_none();
        let mut t_exec = 0;
        match &mut self.graphs {
            // The Genie graphs produce logits themselves; the runner has dequantised them.
            Graphs::Genie(g) => self.logits.copy_from_slice(g.logits()),
            Graphs::Bundle(q) => {
                let g = &q.m.lmhead;
                g.graph.execute(&mut q.lm)?;
                t_exec = clock.lap();
                // Greedy over f16 logits needs no f32 copy: argmax on the f16 bits,
                // finiteness fused.
                if plain_greedy && check {
                    if let crate::ops::convert::Typed::F16(h) = q.lm.output(0) {
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
                q.lm.output(0).read_f32(0, &mut self.logits);
            }
        }
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
        let graph = match &self.graphs {
            Graphs::Bundle(q) => q.m.lmhead.desc.name.clone(),
            Graphs::Genie(_) => "logits".to_string(),
        };
        Error::NonFinite {
            what: "logits",
            step,
            pos: self.pos.saturating_sub(1),
            graph,
            hint: " — fp16 overflow in the graph is the usual cause (see the seed bundle notes); --allow-nonfinite continues anyway",
        }
    }
}

fn check_finite_hidden(
    hidden: &[f32],
    allow_nonfinite: bool,
    graph: &str,
    step: usize,
    pos: usize,
) -> Result<()> {
    if !allow_nonfinite && sampler::first_non_finite(hidden).is_some() {
        return Err(Error::NonFinite {
            what: "hidden state",
            step,
            pos,
            graph: graph.to_string(),
            hint: " — fp16 overflow in the graph is the usual cause; --allow-nonfinite continues anyway",
        });
    }
    Ok(())
}

/// Lap timer that costs nothing when off.
struct Clock(Option<Instant>);

impl Clock {
    fn new(on: bool) -> Clock {
        Clock(on.then(Instant::now))
    }

    /// Nanoseconds since the previous lap (0 when off).
    fn lap(&mut self) -> u64 {
        match &mut self.0 {
            Some(t) => {
                let now = Instant::now();
                let d = now.duration_since(*t).as_nanos() as u64;
                *t = now;
                d
            }
            None => 0,
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
    shared::<GenieModel>();
};
