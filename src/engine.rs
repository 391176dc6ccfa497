//! The token loop over the prefill, decode and lm-head graphs.
//!
//! Positions are explicit: `pos` is the number of tokens whose K/V sit in the decode cache,
//! and slot `pos` is the one the next decode step fills. Per decode step the host writes one
//! embedding row, one RoPE row, one mask slot and one K/V row per layer: O(H + K·L), never
//! O(C).

use crate::error::{Error, Result};
use crate::kv::copy_rows;
use crate::model::{LayerIo, Model};
use crate::ops::{mask, rope::RopeTable};
use crate::qnn::Binding;
use crate::sampler;
use crate::stats::Stats;
use serde::Serialize;
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
    pub allow_nonfinite: bool,
}

#[derive(Debug, Clone)]
pub struct Output {
    pub input_ids: Vec<u32>,
    pub output_ids: Vec<u32>,
    pub finish: FinishReason,
    pub stats: Stats,
}

/// What the caller wants after seeing a token.
pub enum Next {
    Continue,
    Stop(FinishReason),
}

pub struct Engine<'m> {
    m: &'m Model,
    rope: RopeTable,
    pre: Option<Binding>,
    dec: Binding,
    lm: Binding,
    logits: Vec<f32>,
    hidden: Vec<f32>,
    scratch: Vec<f32>,
    /// Tokens whose K/V are in the decode cache.
    pos: usize,
    allow_nonfinite: bool,
    /// Host bytes written into graph inputs by the last decode step (for the C-independence
    /// check of issue-level benchmarks).
    pub last_step_bytes: usize,
}

impl<'m> Engine<'m> {
    pub fn new(m: &'m Model) -> Engine<'m> {
        let p = &m.manifest.params;
        let prefill_rows = m.prefill.as_ref().map_or(0, |(_, io)| io.rows);
        let positions = m.max_ctx.max(prefill_rows);
        let rope = RopeTable::new(p.rope_theta, p.head_dim, positions, p.rope_scaling.as_ref());
        let mut e = Engine {
            m,
            rope,
            pre: m.prefill.as_ref().map(|(g, _)| Binding::new(&g.desc)),
            dec: Binding::new(&m.decode.0.desc),
            lm: Binding::new(&m.lmhead.desc),
            logits: vec![0.0; p.vocab],
            hidden: vec![0.0; p.hidden],
            scratch: Vec::new(),
            pos: 0,
            allow_nonfinite: false,
            last_step_bytes: 0,
        };
        e.reset();
        e
    }

    /// Forget the cache: every decode mask slot hidden.
    pub fn reset(&mut self) {
        let io = &self.m.decode.1;
        let mut mk = self.dec.input_mut(io.mask);
        let neg = mk.mask_neg();
        let n = mk.len();
        mk.fill(0, n, neg);
        self.pos = 0;
    }

    pub fn pos(&self) -> usize {
        self.pos
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
        let m = self.m;
        let n = ids.len();
        if n == 0 {
            return Err(Error::Input("the prompt encodes to zero tokens".into()));
        }
        if self.pos + n > m.max_ctx {
            return Err(Error::Input(format!(
                "the prompt is {n} tokens but only {} of max_ctx {} positions are free",
                m.max_ctx - self.pos,
                m.max_ctx
            )));
        }
        let mut stats = Stats {
            prompt_tokens: n,
            load_ms: m.load_ms,
            ..Default::default()
        };
        self.allow_nonfinite = cfg.allow_nonfinite;
        let t0 = Instant::now();
        if !self.run_prompt(ids)? {
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
        let eos = &m.manifest.eos;
        let finish = loop {
            out.push(tok);
            if eos.contains(&tok) {
                break FinishReason::Eos;
            }
            if let Next::Stop(r) = on_token(tok)? {
                break r;
            }
            if out.len() >= cfg.n_tokens {
                break FinishReason::Length;
            }
            if self.pos >= m.max_ctx {
                break FinishReason::CtxFull;
            }
            if crate::cancel::is_requested() {
                break FinishReason::Cancelled;
            }
            self.decode_step(tok)?;
            tok = self.sample_logits(out.len(), cfg)?;
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
    /// Returns false when cancelled (see [`crate::cancel`]) between graph calls.
    fn run_prompt(&mut self, ids: &[u32]) -> Result<bool> {
        let m = self.m;
        let mut i = 0;
        if self.pos == 0 {
            if let Some((g, io)) = &m.prefill {
                if io.ctx == 0 {
                    let c = ids.len().min(io.rows);
                    self.prefill_chunk(&ids[..c], io, g)?;
                    i = c;
                }
            }
        }
        for &t in &ids[i..] {
            if crate::cancel::is_requested() {
                return Ok(false);
            }
            self.decode_step(t)?;
        }
        Ok(!crate::cancel::is_requested())
    }

    /// One prefill execute over `chunk` (at most P tokens) starting at position 0.
    fn prefill_chunk(
        &mut self,
        chunk: &[u32],
        io: &LayerIo,
        g: &crate::model::LoadedGraph,
    ) -> Result<()> {
        let m = self.m;
        let p = &m.manifest.params;
        let (h, rows) = (p.hidden, io.rows);
        let pre = self
            .pre
            .as_mut()
            .expect("prefill binding exists with a prefill graph");
        {
            let mut x = pre.input_mut(io.x);
            for (r, &t) in chunk.iter().enumerate() {
                m.embed.write_row(t, &mut x, r * h)?;
            }
            x.fill(chunk.len() * h, (rows - chunk.len()) * h, 0.0);
        }
        pre.input_mut(io.cos)
            .write_f32(0, self.rope.cos_rows(0, rows));
        pre.input_mut(io.sin)
            .write_f32(0, self.rope.sin_rows(0, rows));
        {
            let mut mk = pre.input_mut(io.mask);
            let neg = mk.mask_neg();
            mk.write_f32(0, &mask::prefill_causal(rows, 0, 0, neg));
        }
        g.graph.execute(pre)?;
        // Seed the decode cache with the chunk's rows and open their mask slots.
        let dio = &m.decode.1;
        let dshape = dio.past_shape.expect("decode graphs have past inputs");
        for (l, &(nk, nv)) in io.new.iter().enumerate() {
            let (pk, pv) = dio.past[l];
            for (o, i) in [(nk, pk), (nv, pv)] {
                copy_rows(
                    (&pre.output(o), &io.new_shape, 0),
                    (&mut self.dec.input_mut(i), &dshape, 0),
                    chunk.len(),
                    &mut self.scratch,
                );
            }
        }
        self.dec.input_mut(dio.mask).fill(0, chunk.len(), 0.0);
        // The last real row's hidden state goes to the lm-head.
        let last = chunk.len() - 1;
        pre.output(io.y).read_f32(last * h, &mut self.hidden);
        self.check_finite_hidden(&g.desc.name, 0, last)?;
        self.lm.input_mut(0).write_f32(0, &self.hidden);
        self.pos = chunk.len();
        Ok(())
    }

    /// Run the decode graph for `token` at position `self.pos`, then store its K/V.
    fn decode_step(&mut self, token: u32) -> Result<()> {
        let m = self.m;
        let (g, io) = (&m.decode.0, &m.decode.1);
        let h = m.manifest.params.hidden;
        let p = self.pos;
        let dshape = io.past_shape.expect("decode graphs have past inputs");
        {
            let mut x = self.dec.input_mut(io.x);
            m.embed.write_row(token, &mut x, 0)?;
        }
        self.dec.input_mut(io.cos).write_f32(0, self.rope.cos(p));
        self.dec.input_mut(io.sin).write_f32(0, self.rope.sin(p));
        g.graph.execute(&mut self.dec)?;
        let mut bytes = 0;
        for (l, &(nk, nv)) in io.new.iter().enumerate() {
            let (pk, pv) = io.past[l];
            for (o, i) in [(nk, pk), (nv, pv)] {
                bytes += self.dec.desc.outputs[o].bytes();
                let (src, mut dst) = self.dec.output_and_input_mut(o, i);
                copy_rows(
                    (&src, &io.new_shape, 0),
                    (&mut dst, &dshape, p),
                    1,
                    &mut self.scratch,
                );
            }
        }
        self.dec.input_mut(io.mask).fill(p, 1, 0.0);
        self.dec.output(io.y).read_f32(0, &mut self.hidden);
        self.check_finite_hidden(&g.desc.name, p, p)?;
        self.lm.input_mut(0).write_f32(0, &self.hidden);
        let es = |d: &crate::qnn::TensorDesc| qnn_sys::dtype::size_of(d.dtype).unwrap_or(0);
        bytes += h * es(&self.dec.desc.inputs[io.x])
            + 2 * m.manifest.params.head_dim * es(&self.dec.desc.inputs[io.cos])
            + es(&self.dec.desc.inputs[io.mask])
            + h * es(&self.lm.desc.inputs[0]);
        self.last_step_bytes = bytes;
        self.pos = p + 1;
        Ok(())
    }

    /// Execute the lm-head on its current input and pick the next token.
    fn sample_logits(&mut self, step: usize, cfg: &GenConfig) -> Result<u32> {
        let g = &self.m.lmhead;
        g.graph.execute(&mut self.lm)?;
        self.lm.output(0).read_f32(0, &mut self.logits);
        if !(cfg.allow_nonfinite || self.allow_nonfinite) {
            if let Some(_i) = sampler::first_non_finite(&self.logits) {
                return Err(Error::NonFinite {
                    what: "logits",
                    step,
                    pos: self.pos.saturating_sub(1),
                    graph: g.desc.name.clone(),
                    hint: " — fp16 overflow in the graph is the usual cause (see the seed bundle notes); --allow-nonfinite continues anyway",
                });
            }
        }
        Ok(sampler::argmax(&self.logits))
    }

    fn check_finite_hidden(&self, graph: &str, step: usize, pos: usize) -> Result<()> {
        if !self.allow_nonfinite && sampler::first_non_finite(&self.hidden).is_some() {
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
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}
