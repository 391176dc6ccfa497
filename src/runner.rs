//! Executes a [`Plan`]: feeds tokens through its step graphs, keeps the K/V cache and the
//! position cursor, and leaves the last token's logits readable. It knows sources and
//! sinks, not bundle kinds: a manifest bundle and a Genie bundle run through the same code.
//!
//! Per one-token step the host writes one token row, one RoPE row, one mask slot (or a
//! step's whole mask when the plan has no persistent one) and one K/V row per layer.

use crate::error::{Error, Result};
use crate::kv::{clear_rows, copy_rows};
use crate::ops::convert::Typed;
use crate::ops::{mask, rope::RopeTable};
use crate::plan::{KvTensor, MaskSpec, Pad, Plan, Sink, Source};
use crate::qnn::BindingSet;
use serde::Serialize;
use std::sync::Arc;
use std::time::Instant;

pub struct Runner {
    plan: Arc<Plan>,
    bind: BindingSet,
    /// index[step][split]: the binding of that graph; the head's binding is `head`.
    index: Vec<Vec<usize>>,
    head: Option<usize>,
    /// Per step: its persistent masks as (binding, input, spec).
    persist: Vec<Vec<(usize, usize, MaskSpec)>>,
    /// Per step: the output that ends it, as (binding, output, sink).
    result: Vec<(usize, usize, Sink)>,
    /// One table per [`Plan::ropes`] entry.
    rope: Vec<RopeTable>,
    /// Tokens whose K/V are in the cache; the next token takes slot `pos`.
    pos: usize,
    /// The step whose past inputs hold the cache.
    home: usize,
    /// Times the cache moved to another rung of a context ladder since the last reset.
    rung_moves: usize,
    /// Where the last fed token's logits are, when a step produces them: (binding,
    /// output, row).
    logits_at: Option<(usize, usize, usize)>,
    /// The last execute: (step, offset of its first real row, real rows).
    last: Option<(usize, usize, usize)>,
    hidden: Vec<f32>,
    scratch: Vec<f32>,
    rows_buf: Vec<f32>,
    /// Keep going on NaN / inf hidden states (`--allow-nonfinite`).
    pub allow_nonfinite: bool,
    /// Step executes since the runner was made (a draft model's cost, in executes).
    executes: usize,
    /// The verify head's binding, and whether it has run on the last execute's rows.
    vhead: Option<usize>,
    vhead_fresh: bool,
}

impl Runner {
    /// Bind every graph of the plan (rpcmem + memRegister when the runtime has rpcmem),
    /// with each cache-sharing step's past inputs backed by its owner's buffers.
    pub fn new(plan: &Arc<Plan>) -> Result<Runner> {
        let mut graphs = Vec::new();
        let mut index = Vec::new();
        for st in &plan.steps {
            let mut v = Vec::new();
            for sp in &st.splits {
                v.push(graphs.len());
                graphs.push((&sp.graph, &sp.desc));
            }
            index.push(v);
        }
        let head = plan.head.as_ref().map(|h| {
            graphs.push((&h.graph, &h.desc));
            graphs.len() - 1
        });
        let vhead = plan.verify_head.as_ref().map(|h| {
            graphs.push((&h.graph, &h.desc));
            graphs.len() - 1
        });
        let mut aliases = Vec::new();
        for (s, st) in plan.steps.iter().enumerate() {
            let Some(o) = st.cache_owner else { continue };
            for (mine, theirs) in st.layers.iter().zip(&plan.steps[o].layers) {
                let pairs = [
                    (mine.past_key, theirs.past_key),
                    (mine.past_value, theirs.past_value),
                ];
                for (a, b) in pairs {
                    if let (Some(a), Some(b)) = (a, b) {
                        aliases.push(((index[s][a.at.0], a.at.1), (index[o][b.at.0], b.at.1)));
                    }
                }
            }
        }
        let bind = BindingSet::new(&graphs, &aliases)?;
        let mut persist = Vec::new();
        let mut result = Vec::new();
        for (s, st) in plan.steps.iter().enumerate() {
            let mut v = Vec::new();
            for (k, i) in st.inputs_where(|src| matches!(src, Source::Mask(m) if m.persistent)) {
                if let Source::Mask(spec) = st.splits[k].inputs[i] {
                    v.push((index[s][k], i, spec));
                }
            }
            persist.push(v);
            let Some(((k, o), sink)) = st.result() else {
                return Err(Error::graph(
                    st.name(),
                    "has no logits or hidden-state output",
                ));
            };
            if matches!(sink, Sink::Hidden) && plan.head.is_none() {
                return Err(Error::graph(
                    st.name(),
                    "gives hidden states but the bundle has no head graph",
                ));
            }
            result.push((index[s][k], o, sink));
        }
        let uses_embedding = plan.steps.iter().any(|st| {
            !st.inputs_where(|s| matches!(s, Source::Embedding))
                .is_empty()
        });
        if uses_embedding && plan.embed.is_none() {
            return Err(Error::graph(
                plan.decode().name(),
                "takes embedding rows but the bundle has no embedding table",
            ));
        }
        let hidden = plan.head.as_ref().map_or(0, |h| h.desc.inputs[0].elems());
        let rope = plan
            .ropes
            .iter()
            .map(|r| {
                RopeTable::new(
                    r.theta,
                    r.head_dim,
                    plan.max_ctx + plan.max_rows(),
                    r.scaling.as_ref(),
                )
            })
            .collect();
        let mut r = Runner {
            plan: Arc::clone(plan),
            bind,
            index,
            head,
            persist,
            result,
            rope,
            pos: 0,
            home: plan.first_home(),
            rung_moves: 0,
            logits_at: None,
            last: None,
            hidden: vec![0.0; hidden],
            scratch: Vec::new(),
            rows_buf: Vec::new(),
            allow_nonfinite: false,
            executes: 0,
            vhead,
            vhead_fresh: false,
        };
        r.reset()?;
        Ok(r)
    }

    pub fn plan(&self) -> &Arc<Plan> {
        &self.plan
    }

    pub fn pos(&self) -> usize {
        self.pos
    }

    /// The cache capacity of the step that holds the cache now (the current rung of a
    /// context ladder), and how often the cache moved between rungs since the last reset.
    pub fn rung(&self) -> (usize, usize) {
        (self.plan.steps[self.home].past, self.rung_moves)
    }

    /// True when every graph's I/O is zero-copy (registered rpcmem buffers).
    pub fn zero_copy(&self) -> bool {
        self.bind.all_shared()
    }

    /// Forget the cache: every persistent mask slot hidden.
    pub fn reset(&mut self) -> Result<()> {
        self.pos = 0;
        self.home = self.plan.first_home();
        self.rung_moves = 0;
        self.logits_at = None;
        self.last = None;
        for s in 0..self.persist.len() {
            self.set_persistent(s, 0, usize::MAX, false)?;
        }
        // Every cache slot holds real 0 until written (see kv::clear_rows).
        for s in 0..self.plan.steps.len() {
            if self.plan.home(s) == Some(s) {
                self.clear_cache(s, 0, usize::MAX);
            }
        }
        // Recurrent states start from zeros (a prompt run through decode alone reads them).
        let dec = self.plan.steps.len() - 1;
        for st in &self.plan.decode().states {
            if let Some((k, i)) = st.past {
                self.bind
                    .get_mut(self.index[dec][k])
                    .input_bytes_mut(i)
                    .fill(0);
            }
        }
        Ok(())
    }

    /// Step executes since the runner was made.
    pub fn executes(&self) -> usize {
        self.executes
    }

    /// Whether the cache can go back to an earlier position ([`Runner::rewind`]): not when
    /// layers carry recurrent state (a conv state keeps no history).
    pub fn can_rewind(&self) -> bool {
        !self.plan.has_state()
    }

    /// Forget cached positions from `pos` on; the next token takes slot `pos`.
    pub fn rewind(&mut self, pos: usize) -> Result<()> {
        if pos >= self.pos {
            return Ok(());
        }
        if !self.can_rewind() {
            return Err(Error::graph(
                self.plan.decode().name(),
                format!(
                    "cannot go back from position {} to {pos}: its conv layers' state keeps no history (start again from 0)",
                    self.pos
                ),
            ));
        }
        let n = self.pos - pos;
        self.clear_cache(self.home, pos, self.pos);
        self.set_home_masks(pos, n, false)?;
        self.slide_windows(None, self.pos, pos)?;
        self.pos = pos;
        Ok(())
    }

    /// Feed `ids` from the current position, leaving the last one's logits readable
    /// ([`Runner::logits`]). `cancelled` is polled before each execute; returns false when
    /// it stopped the feed. Each chunk goes to the first step (most rows first) that admits
    /// it at the current position.
    pub fn feed(
        &mut self,
        ids: &[u32],
        cancelled: &dyn Fn() -> bool,
        mut profile: Option<&mut StepProfile>,
    ) -> Result<bool> {
        let plan = Arc::clone(&self.plan);
        let mut i = 0;
        while i < ids.len() {
            if cancelled() {
                return Ok(false);
            }
            let left = ids.len() - i;
            let free = plan.max_ctx.saturating_sub(self.pos);
            let step = (0..plan.steps.len()).find(|&s| plan.steps[s].admits(self.pos, left));
            let k = step.map_or(0, |s| left.min(plan.steps[s].rows));
            let Some(s) = step.filter(|_| k <= free) else {
                return Err(Error::PromptTooLong {
                    tokens: left,
                    free,
                    max_ctx: plan.max_ctx,
                });
            };
            self.execute(s, &ids[i..i + k], profile.as_deref_mut())?;
            i += k;
        }
        Ok(true)
    }

    /// Whether `n` tokens fed now run as one execute whose every row's logits can be read
    /// ([`Runner::row_logits`]): a verify of `n - 1` drafted tokens after the last pick.
    pub fn verifies(&self, n: usize) -> bool {
        let plan = &self.plan;
        if n < 2 || self.pos + n > plan.max_ctx || plan.has_state() {
            return false;
        }
        let Some(s) = (0..plan.steps.len()).find(|&s| plan.steps[s].admits(self.pos, n)) else {
            return false;
        };
        plan.steps[s].rows >= n
            && match self.result[s].2 {
                Sink::Hidden => self.head.is_some(),
                Sink::Logits { rows } => rows >= n,
                _ => false,
            }
    }

    /// One execute of step `s` over `chunk` (at most its rows) at `self.pos`.
    fn execute(
        &mut self,
        s: usize,
        chunk: &[u32],
        profile: Option<&mut StepProfile>,
    ) -> Result<()> {
        let plan = Arc::clone(&self.plan);
        let st = &plan.steps[s];
        let (rows, n, pos) = (st.rows, chunk.len(), self.pos);
        let off = match st.pad {
            Pad::Right => 0,
            Pad::Left => rows - n,
        };
        let mut clock = Clock::new(profile.is_some());
        let mut t = Times::default();
        if let Some(h) = plan.home(s) {
            if h != self.home {
                self.move_cache(self.home, h)?;
                if self.plan.steps[h].past != self.plan.steps[self.home].past {
                    self.rung_moves += 1;
                }
                self.home = h;
            }
        }
        for (k, sp) in st.splits.iter().enumerate() {
            let b = self.index[s][k];
            for (i, src) in sp.inputs.iter().enumerate() {
                match *src {
                    Source::TokenIds => {
                        let pad = plan.pad_id;
                        let bytes = self.bind.get_mut(b).input_bytes_mut(i);
                        for r in 0..rows {
                            let id = if r >= off && r < off + n {
                                chunk[r - off]
                            } else {
                                pad
                            };
                            bytes[r * 4..r * 4 + 4].copy_from_slice(&(id as i32).to_le_bytes());
                        }
                        t.embed += clock.lap();
                    }
                    Source::Embedding => {
                        let embed = plan.embed.as_ref().expect("checked in Runner::new");
                        let mut x = self.bind.get_mut(b).input_mut(i);
                        let h = x.len() / rows;
                        for r in 0..rows {
                            if r >= off && r < off + n {
                                embed.write_row(chunk[r - off], &mut x, r * h)?;
                            } else {
                                x.fill(r * h, h, 0.0);
                            }
                        }
                        t.embed += clock.lap();
                    }
                    Source::Cos { width, table } | Source::Sin { width, table } => {
                        let cos = matches!(src, Source::Cos { .. });
                        self.write_rope(b, i, (table, cos), width, rows, pos, off);
                        t.rope += clock.lap();
                    }
                    Source::Mask(spec) if !spec.persistent => {
                        let mut m = self.bind.get_mut(b).input_mut(i);
                        mask::write(&mut m, &spec, rows, pos, off, n)?;
                        t.mask += clock.lap();
                    }
                    Source::Link { split, output } => {
                        let from = self.index[s][split];
                        let (src_b, dst_b) = self.bind.two(from, b);
                        let (src, dst) = (src_b.output_bytes(output), dst_b.input_bytes_mut(i));
                        if src.len() != dst.len() {
                            return Err(Error::graph(
                                &sp.desc.name,
                                format!(
                                    "input {} ({} bytes) cannot take {} of {} ({} bytes)",
                                    sp.desc.inputs[i].name,
                                    dst.len(),
                                    st.splits[split].desc.outputs[output].name,
                                    st.splits[split].desc.name,
                                    src.len()
                                ),
                            ));
                        }
                        dst.copy_from_slice(src);
                        t.io += clock.lap();
                    }
                    // Persistent masks change as the cache does; caches and states are read
                    // in place.
                    Source::Mask(_)
                    | Source::PastKey(_)
                    | Source::PastValue(_)
                    | Source::StatePast(_)
                    | Source::Unfed => {}
                }
            }
            sp.graph.execute(self.bind.get_mut(b))?;
            t.exec += clock.lap();
        }
        // The chunk's K/V rows go into the cache at pos.., and their slots open.
        let home = &plan.steps[self.home];
        for (l, kv) in st.layers.iter().enumerate() {
            let hl = &home.layers[l];
            for (new, past) in [(kv.new_key, hl.past_key), (kv.new_value, hl.past_value)] {
                let past = past.ok_or_else(|| {
                    Error::graph(
                        home.name(),
                        format!("layer {l} has no past K/V input to hold the cache"),
                    )
                })?;
                self.copy_new_rows(s, new, past, off, n)?;
            }
        }
        self.carry_states(s, off, n)?;
        t.kv += clock.lap();
        self.set_home_masks(pos, n, true)?;
        self.slide_windows(None, pos, pos + n)?;
        t.mask += clock.lap();
        self.take_result(s, off, n)?;
        t.io += clock.lap();
        self.pos = pos + n;
        self.last = Some((s, off, n));
        self.executes += 1;
        self.vhead_fresh = false;
        if let Some(p) = profile {
            p.embed_ns += t.embed;
            p.rope_ns += t.rope;
            p.mask_ns += t.mask;
            p.kv_write_ns += t.kv;
            p.io_convert_ns += t.io;
            p.execute_ns += t.exec;
        }
        Ok(())
    }

    /// RoPE rows for the step: row r takes position pos + (r - off); padding rows before
    /// the real ones take `pos`, after them they continue counting.
    #[allow(clippy::too_many_arguments)]
    fn write_rope(
        &mut self,
        b: usize,
        i: usize,
        (which, cos): (usize, bool),
        width: usize,
        rows: usize,
        pos: usize,
        off: usize,
    ) {
        let table = &self.rope[which];
        let row = |p: usize| {
            let full = if cos { table.cos(p) } else { table.sin(p) };
            &full[..width]
        };
        let mut x = self.bind.get_mut(b).input_mut(i);
        if off == 0 && width == self.plan.ropes[which].head_dim {
            // Contiguous positions pos..pos+rows: one write.
            let all = if cos {
                table.cos_rows(pos, rows)
            } else {
                table.sin_rows(pos, rows)
            };
            x.write_f32(0, all);
        } else if rows == 1 {
            x.write_f32(0, row(pos));
        } else {
            self.rows_buf.clear();
            for r in 0..rows {
                self.rows_buf
                    .extend_from_slice(row(pos + r.saturating_sub(off)));
            }
            x.write_f32(0, &self.rows_buf);
        }
    }

    /// Copy rows off..off+n of step `s`'s new K or V output into cache slots pos.. of the
    /// home step's past input.
    fn copy_new_rows(
        &mut self,
        s: usize,
        new: KvTensor,
        past: KvTensor,
        off: usize,
        n: usize,
    ) -> Result<()> {
        let a = self.index[s][new.at.0];
        let b = self.index[self.home][past.at.0];
        let pos = self.pos;
        if a == b {
            let (src, mut dst) = self
                .bind
                .get_mut(a)
                .output_and_input_mut(new.at.1, past.at.1);
            copy_rows(
                (&src, &new.shape, off),
                (&mut dst, &past.shape, pos),
                n,
                &mut self.scratch,
            );
        } else {
            let (x, y) = self.bind.two(a, b);
            let src = x.output(new.at.1);
            let mut dst = y.input_mut(past.at.1);
            copy_rows(
                (&src, &new.shape, off),
                (&mut dst, &past.shape, pos),
                n,
                &mut self.scratch,
            );
        }
        Ok(())
    }

    /// After a step: the last real row's hidden state into the head's input (checked
    /// finite), or where its logits row is.
    fn take_result(&mut self, s: usize, off: usize, n: usize) -> Result<()> {
        let (b, o, sink) = self.result[s];
        let last = off + n - 1;
        match (sink, self.head) {
            (Sink::Hidden, Some(head)) => {
                let h = self.hidden.len();
                self.bind
                    .get(b)
                    .output(o)
                    .read_f32(last * h, &mut self.hidden);
                if !self.allow_nonfinite && crate::sampler::first_non_finite(&self.hidden).is_some()
                {
                    let st = &self.plan.steps[s];
                    // A one-token step reports its position as the step; a prompt chunk is step 0.
                    let step = if st.rows == 1 { self.pos } else { 0 };
                    return Err(Error::NonFinite {
                        what: "hidden state",
                        step,
                        pos: self.pos + n - 1,
                        graph: self.bind.get(b).desc.name.clone(),
                        hint: " — fp16 overflow in the graph is the usual cause; --allow-nonfinite continues anyway",
                    });
                }
                self.bind
                    .get_mut(head)
                    .input_mut(0)
                    .write_f32(0, &self.hidden);
                self.logits_at = None;
            }
            (Sink::Logits { rows }, _) => {
                let row = if rows == 1 { 0 } else { last };
                self.logits_at = Some((b, o, row));
            }
            // `new` refuses a hidden-state step without a head.
            _ => {}
        }
        Ok(())
    }

    /// The last fed token's logits (vocab values): the head graph runs here when the plan
    /// has one.
    pub fn logits(&mut self) -> Result<Typed<'_>> {
        let vocab = self.plan.vocab;
        if let (Some(h), Some(head)) = (self.head, self.plan.head.as_ref()) {
            head.graph.execute(self.bind.get_mut(h))?;
            return Ok(self.bind.get(h).output(0).slice(0, vocab));
        }
        let (b, o, row) = self.logits_at.ok_or_else(|| {
            Error::graph(
                self.plan.decode().name(),
                "no token has been fed: there are no logits yet",
            )
        })?;
        Ok(self.bind.get(b).output(o).slice(row * vocab, vocab))
    }

    /// Logits of the `j`-th token of the last execute (0-based within its chunk), e.g. to
    /// verify several drafted tokens from one execute. With a head graph the row's hidden
    /// state goes through it; a graph that gives only the last row's logits has no others.
    pub fn row_logits(&mut self, j: usize) -> Result<Typed<'_>> {
        let vocab = self.plan.vocab;
        let Some((s, off, n)) = self.last else {
            return Err(Error::graph(
                self.plan.decode().name(),
                "no token has been fed: there are no logits yet",
            ));
        };
        let (b, o, sink) = self.result[s];
        if j < n && matches!(sink, Sink::Hidden) && self.run_verify_head(false)? {
            let h = self.vhead.expect("run_verify_head checked it");
            return Ok(self.bind.get(h).output(0).slice(j * vocab, vocab));
        }
        let name = || self.bind.get(b).desc.name.clone();
        if j >= n {
            return Err(Error::graph(
                name(),
                format!("the last execute fed {n} tokens; there is no token {j}"),
            ));
        }
        let row = off + j;
        match (sink, self.head, self.plan.head.as_ref()) {
            (Sink::Hidden, Some(h), Some(head)) => {
                let width = self.hidden.len();
                self.bind
                    .get(b)
                    .output(o)
                    .read_f32(row * width, &mut self.hidden);
                self.bind.get_mut(h).input_mut(0).write_f32(0, &self.hidden);
                head.graph.execute(self.bind.get_mut(h))?;
                Ok(self.bind.get(h).output(0).slice(0, vocab))
            }
            (Sink::Logits { rows }, ..) if rows > 1 => {
                Ok(self.bind.get(b).output(o).slice(row * vocab, vocab))
            }
            (Sink::Logits { .. }, ..) if j == n - 1 => {
                Ok(self.bind.get(b).output(o).slice(0, vocab))
            }
            _ => Err(Error::graph(
                name(),
                format!("gives only the last row's logits, not token {j}'s"),
            )),
        }
    }

    /// The argmax of row `j` of the last execute, when the bundle's verify head computes
    /// it in the graph (None: read the row's logits instead).
    pub fn row_pick(&mut self, j: usize) -> Result<Option<u32>> {
        let Some((s, _, n)) = self.last else {
            return Ok(None);
        };
        if j >= n || !matches!(self.result[s].2, Sink::Hidden) || !self.run_verify_head(true)? {
            return Ok(None);
        }
        let h = self.vhead.expect("run_verify_head checked it");
        let Typed::I32(ids) = self.bind.get(h).output(0) else {
            return Ok(None);
        };
        Ok(u32::try_from(ids[j]).ok())
    }

    /// Run the verify head over the last execute's rows (once per execute) when the bundle
    /// has one of the kind asked for (`ids`: argmax ids, else logits) that holds them all.
    /// False when it does not apply (the one-row head serves instead).
    fn run_verify_head(&mut self, ids: bool) -> Result<bool> {
        let (Some(vh), Some(spec)) = (self.vhead, self.plan.verify_head.as_ref()) else {
            return Ok(false);
        };
        let Some((s, off, n)) = self.last else {
            return Ok(false);
        };
        if spec.ids != ids || n > spec.rows || n < 2 {
            return Ok(false);
        }
        if !self.vhead_fresh {
            let (b, o, _) = self.result[s];
            let width = self.hidden.len();
            let mut rows = std::mem::take(&mut self.rows_buf);
            rows.resize(spec.rows * width, 0.0);
            // Rows past the chunk are zero (their picks are never read).
            rows[n * width..].fill(0.0);
            self.bind
                .get(b)
                .output(o)
                .read_f32(off * width, &mut rows[..n * width]);
            self.bind.get_mut(vh).input_mut(0).write_f32(0, &rows);
            self.rows_buf = rows;
            spec.graph.execute(self.bind.get_mut(vh))?;
            self.vhead_fresh = true;
        }
        Ok(true)
    }

    /// A copy of the cache state (the home step's past inputs and the persistent masks that
    /// follow them, byte for byte, and the position), to [`Runner::restore`] later: a
    /// rejected continuation is undone exactly, whatever the layers keep (K/V or other
    /// state the plan carries in past inputs).
    pub fn snapshot(&self) -> Snapshot {
        let st = &self.plan.steps[self.home];
        let mut bufs = Vec::new();
        for l in &st.layers {
            for t in [l.past_key, l.past_value].into_iter().flatten() {
                let b = self.index[self.home][t.at.0];
                bufs.push((b, t.at.1, self.bind.get(b).input_bytes(t.at.1).to_vec()));
            }
        }
        let dec = self.plan.steps.len() - 1;
        for t in self.plan.decode().states.iter().filter_map(|s| s.past) {
            let b = self.index[dec][t.0];
            bufs.push((b, t.1, self.bind.get(b).input_bytes(t.1).to_vec()));
        }
        for (s, masks) in self.persist.iter().enumerate() {
            if self.plan.home(s) == Some(self.home) {
                for &(b, i, _) in masks {
                    bufs.push((b, i, self.bind.get(b).input_bytes(i).to_vec()));
                }
            }
        }
        Snapshot {
            pos: self.pos,
            home: self.home,
            bufs,
        }
    }

    /// Put back a [`Snapshot`] taken from this runner. The next token fed continues from
    /// its position; logits are available again after that feed.
    pub fn restore(&mut self, snap: &Snapshot) -> Result<()> {
        if snap.home >= self.plan.steps.len() {
            return Err(Error::graph(
                self.plan.decode().name(),
                "the snapshot was taken from another plan",
            ));
        }
        for (b, i, bytes) in &snap.bufs {
            let dst = self.bind.get_mut(*b).input_bytes_mut(*i);
            if dst.len() != bytes.len() {
                return Err(Error::graph(
                    self.bind.get(*b).desc.name.clone(),
                    "the snapshot was taken from another plan",
                ));
            }
            dst.copy_from_slice(bytes);
        }
        self.pos = snap.pos;
        self.home = snap.home;
        self.logits_at = None;
        self.last = None;
        Ok(())
    }

    /// The graph whose output holds the logits (for error messages).
    pub fn logits_graph(&self) -> String {
        let b = match (self.head, self.logits_at) {
            (Some(h), _) => h,
            (None, Some((b, ..))) => b,
            (None, None) => self.result[self.plan.steps.len() - 1].0,
        };
        self.bind.get(b).desc.name.clone()
    }

    /// Copy the cache (slots [0, pos)) from step `a`'s past inputs to step `b`'s, and set
    /// `b`'s persistent masks to match.
    fn move_cache(&mut self, a: usize, b: usize) -> Result<()> {
        let plan = Arc::clone(&self.plan);
        let pos = self.pos;
        if pos > 0 {
            for (la, lb) in plan.steps[a].layers.iter().zip(&plan.steps[b].layers) {
                for (x, y) in [(la.past_key, lb.past_key), (la.past_value, lb.past_value)] {
                    let (Some(x), Some(y)) = (x, y) else {
                        return Err(Error::graph(
                            plan.steps[b].name(),
                            "a step without past K/V inputs cannot hold the cache",
                        ));
                    };
                    let (ia, ib) = (self.index[a][x.at.0], self.index[b][y.at.0]);
                    let (src_b, dst_b) = self.bind.two(ia, ib);
                    let src = src_b.input(x.at.1);
                    let mut dst = dst_b.input_mut(y.at.1);
                    copy_rows(
                        (&src, &x.shape, 0),
                        (&mut dst, &y.shape, 0),
                        pos,
                        &mut self.scratch,
                    );
                }
            }
        }
        // Slots past the copied ones may hold what `b` cached before (an earlier turn).
        self.clear_cache(b, pos, usize::MAX);
        self.set_persistent(b, 0, pos, true)?;
        self.set_persistent(b, pos, usize::MAX, false)?;
        self.slide_windows(Some(b), 0, pos)
    }

    /// Set cache slots `from..to` (clamped to the cache) of step `s`'s past K/V inputs to
    /// real 0 ([`clear_rows`]). `s` must own its past inputs (a cache home).
    fn clear_cache(&mut self, s: usize, from: usize, to: usize) {
        let plan = Arc::clone(&self.plan);
        for l in &plan.steps[s].layers {
            for t in [l.past_key, l.past_value].into_iter().flatten() {
                let b = self.index[s][t.at.0];
                let mut dst = self.bind.get_mut(b).input_mut(t.at.1);
                let end = to.min(t.shape.rows);
                if end > from {
                    clear_rows(&mut dst, &t.shape, from, end - from);
                }
            }
        }
    }

    /// After the cursor moved from `from` to `to`: close the slots that slid out of each
    /// window mask (forward), or reopen those that slid back in (a rewind). Only masks of
    /// `step` (or, for `None`, of the steps the current home serves).
    fn slide_windows(&mut self, step: Option<usize>, from: usize, to: usize) -> Result<()> {
        use crate::ops::mask::window_start;
        for s in 0..self.persist.len() {
            let mine = match step {
                Some(x) => x == s,
                None => self.plan.home(s) == Some(self.home),
            };
            if !mine {
                continue;
            }
            for k in 0..self.persist[s].len() {
                let (b, i, spec) = self.persist[s][k];
                let Some(w) = spec.window else { continue };
                let (a, z) = (window_start(from, w), window_start(to, w));
                let mut m = self.bind.get_mut(b).input_mut(i);
                let len = m.len();
                if z > a {
                    let at = a.min(len);
                    mask::set_slots(&mut m, &spec, at, z.min(len) - at, false)?;
                } else if a > z {
                    // Back inside the window: slots z..a that the cache still holds.
                    let end = a.min(to).min(len);
                    let at = z.min(end);
                    mask::set_slots(&mut m, &spec, at, end - at, true)?;
                }
            }
        }
        Ok(())
    }

    /// After step `s` fed `n` real rows from `off`: a decode's new state becomes the next
    /// step's (bytes as they are: the resolver checked both ends match), and a prefill
    /// seeds the decode state from its last `width` real rows (zeros before the prompt).
    fn carry_states(&mut self, s: usize, off: usize, n: usize) -> Result<()> {
        let plan = Arc::clone(&self.plan);
        let dec = plan.steps.len() - 1;
        for (st, home) in plan.steps[s].states.iter().zip(&plan.decode().states) {
            let Some((hk, hi)) = home.past else { continue };
            let hb = self.index[dec][hk];
            if let Some((k, o)) = st.present {
                let b = self.index[s][k];
                if b == hb {
                    let (src, dst) = self.bind.get_mut(b).output_and_input_bytes_mut(o, hi);
                    dst.copy_from_slice(src);
                } else {
                    let (x, y) = self.bind.two(b, hb);
                    y.input_bytes_mut(hi).copy_from_slice(x.output_bytes(o));
                }
            }
            if let Some((k, o)) = st.seed {
                let b = self.index[s][k];
                let rows = plan.steps[s].rows;
                let stride = plan.steps[s].output_desc((k, o)).elems() / rows;
                let (c, w) = (home.channels, home.width);
                let mut state = vec![0f32; c * w];
                let mut row = vec![0f32; c];
                let (x, y) = self.bind.two(b, hb);
                // Column j holds real row n - w + j (oldest first).
                for j in 0..w {
                    let Some(r) = (n + j).checked_sub(w) else {
                        continue;
                    };
                    x.output(o).read_f32((off + r) * stride, &mut row);
                    for (ch, v) in row.iter().enumerate() {
                        state[ch * w + j] = *v;
                    }
                }
                y.input_mut(hi).write_f32(0, &state);
            }
        }
        Ok(())
    }

    /// Open or hide slots `at..at + n` of the persistent masks that follow the current
    /// cache home (those of every step whose home it is).
    fn set_home_masks(&mut self, at: usize, n: usize, visible: bool) -> Result<()> {
        for s in 0..self.persist.len() {
            if self.plan.home(s) == Some(self.home) {
                self.set_persistent(s, at, n, visible)?;
            }
        }
        Ok(())
    }

    /// Open or hide slots `at..at + n` (clipped to the mask) of step `s`'s persistent masks.
    fn set_persistent(&mut self, s: usize, at: usize, n: usize, visible: bool) -> Result<()> {
        for &(b, i, spec) in &self.persist[s] {
            let mut m = self.bind.get_mut(b).input_mut(i);
            let len = m.len();
            let at = at.min(len);
            mask::set_slots(&mut m, &spec, at, n.min(len - at), visible)?;
        }
        Ok(())
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

/// Cache state saved by [`Runner::snapshot`].
pub struct Snapshot {
    pos: usize,
    home: usize,
    /// (binding, input, bytes) of every buffer that holds the state.
    bufs: Vec<(usize, usize, Vec<u8>)>,
}

impl Snapshot {
    /// Tokens the cache held when it was taken.
    pub fn pos(&self) -> usize {
        self.pos
    }
}

/// Per-component host time of one execute.
#[derive(Default)]
struct Times {
    embed: u64,
    rope: u64,
    mask: u64,
    kv: u64,
    io: u64,
    exec: u64,
}

/// Lap timer that costs nothing when off.
pub(crate) struct Clock(Option<Instant>);

impl Clock {
    pub(crate) fn new(on: bool) -> Clock {
        Clock(on.then(Instant::now))
    }

    /// Nanoseconds since the previous lap (0 when off).
    pub(crate) fn lap(&mut self) -> u64 {
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
