//! The resolved graph plan: what a bundle's graphs are and how the host feeds them, in one
//! description that manifest bundles and Genie bundles both resolve into ([`manifest`],
//! [`genie`]). The runner ([`crate::runner`]) executes a plan without knowing which kind of
//! bundle it came from.
//!
//! A plan is a list of step graphs (most rows first; the last takes one token), each one or
//! more splits run in order, plus an optional head graph that turns a hidden row into
//! logits. Every graph input has a [`Source`] (what the host writes before an execute) and
//! every output a [`Sink`] (what the host does with it afterwards). The K/V cache lives in
//! the past inputs of one step at a time (its "home"); steps whose past inputs alias another
//! step's buffers share that home.

pub mod contract;
pub mod genie;
pub mod manifest;

pub use crate::ops::mask::{MaskSpec, MaskStyle};

use crate::bundle::manifest::RopeScaling;
use crate::kv::KvShape;
use crate::ops::embed::EmbedTable;
use crate::qnn::{Graph, GraphDesc, TensorDesc};

/// (split, tensor index) of a tensor within one step.
pub type At = (usize, usize);

/// What the host writes into a graph input before each execute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// One int32 token id per row; padding rows carry the plan's pad id.
    TokenIds,
    /// One embedding-table row per token (host lookup); padding rows are zeros.
    Embedding,
    /// RoPE cos of each row's position: the first `width` values of row p of the plan's
    /// RoPE table `table` (an index into [`Plan::ropes`]).
    Cos {
        width: usize,
        table: usize,
    },
    /// RoPE sin, as `Cos`.
    Sin {
        width: usize,
        table: usize,
    },
    /// An attention mask.
    Mask(MaskSpec),
    /// Layer `l`'s cached keys (the cache home's, see [`Step::cache_owner`]).
    PastKey(usize),
    PastValue(usize),
    /// Layer `l`'s recurrent state before this token (decode only): the previous step's
    /// [`Sink::StatePresent`], or what a prefill's [`Sink::StateSeed`] seeded.
    StatePast(usize),
    /// Output `output` of an earlier split of the same step.
    Link {
        split: usize,
        output: usize,
    },
    /// Nothing the plan knows: left as allocated (zeros).
    Unfed,
}

/// What the host does with a graph output after an execute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sink {
    /// Hidden states, one row per token: the last real row feeds the head graph.
    Hidden,
    /// Logits: one row per token, or only the last token's (`rows == 1`).
    Logits {
        rows: usize,
    },
    /// Layer `l`'s new key rows, copied into the cache.
    NewKey(usize),
    NewValue(usize),
    /// Layer `l`'s state after this token, carried to the next step's [`Source::StatePast`].
    StatePresent(usize),
    /// Rows from which a prefill seeds layer `l`'s state: the state is the last `width`
    /// real rows, one column each (LFM2's `conv_bx_<i>`).
    StateSeed(usize),
    /// Read by a later split, or by nothing.
    Other,
}

/// Where real tokens sit when a chunk is shorter than the step's rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pad {
    /// Real rows first (qhx manifest prefill).
    Right,
    /// Real rows last, so the last real token is always the last row (Genie).
    Left,
}

/// When a step may run, given the cache position and the tokens left to feed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Only on an empty cache (a prefill graph without past inputs).
    FromEmpty,
    /// While all of its rows fit in the cache (`pos + rows <= past`).
    WholeRows,
    /// While the chunk fits (`pos + min(left, rows) <= past`) and at least `min_tokens`
    /// tokens are left.
    Chunk { min_tokens: usize },
}

/// One K or V tensor of a layer: where it is and how its rows are laid out.
#[derive(Debug, Clone, Copy)]
pub struct KvTensor {
    pub at: At,
    pub shape: KvShape,
}

/// One layer's cache tensors in one step.
#[derive(Debug, Clone, Copy)]
pub struct LayerKv {
    pub past_key: Option<KvTensor>,
    pub past_value: Option<KvTensor>,
    pub new_key: KvTensor,
    pub new_value: KvTensor,
}

/// One layer's recurrent state tensors in one step: where the host reads it from and
/// writes it to. Its home is the decode step's past input.
#[derive(Debug, Clone, Copy)]
pub struct LayerState {
    pub layer: usize,
    /// The state input (decode).
    pub past: Option<At>,
    /// The state after the step (decode).
    pub present: Option<At>,
    /// Rows to seed it from (prefill).
    pub seed: Option<At>,
    /// Columns of the state ([channels, width], oldest column first).
    pub width: usize,
    pub channels: usize,
}

/// One graph of a step, with the source of each input and the sink of each output. `G` is
/// the graph handle (`()` when only metadata is resolved, e.g. by `qhx_inspect`).
pub struct Split<G = Graph> {
    pub graph: G,
    pub desc: GraphDesc,
    pub inputs: Vec<Source>,
    pub outputs: Vec<Sink>,
}

/// A graph (or chain of splits) that takes `rows` tokens per execute.
pub struct Step<G = Graph> {
    pub rows: usize,
    /// Cache slots its past inputs hold (0: it has none).
    pub past: usize,
    pub pad: Pad,
    pub admit: Admit,
    /// Another step whose past-input buffers this step's past inputs alias (a chunked
    /// prefill reading the decode cache in place); that step is the cache's home.
    pub cache_owner: Option<usize>,
    pub splits: Vec<Split<G>>,
    /// Per attention layer, in layer order (the K/V cache).
    pub layers: Vec<LayerKv>,
    /// Per recurrent layer, in layer order.
    pub states: Vec<LayerState>,
}

/// The graph that maps one hidden row (input 0) to logits (output 0).
pub struct Head<G = Graph> {
    pub graph: G,
    pub desc: GraphDesc,
}

/// A verify head: the lm-head over `rows` hidden rows in one execute, giving each row's
/// logits (`rows x vocab`) or, when `ids`, each row's argmax (int32, computed in the graph).
pub struct VerifyHead<G = Graph> {
    pub graph: G,
    pub desc: GraphDesc,
    pub rows: usize,
    pub ids: bool,
}

/// RoPE parameters: the runner builds one table of every position from them.
#[derive(Debug, Clone)]
pub struct RopeSpec {
    pub theta: f64,
    pub head_dim: usize,
    pub scaling: Option<RopeScaling>,
}

pub struct Plan<G = Graph> {
    /// Most rows first; the last step takes one token (decode).
    pub steps: Vec<Step<G>>,
    pub head: Option<Head<G>>,
    /// The verify head, when the bundle has one: a verify's rows go through it at once.
    pub verify_head: Option<VerifyHead<G>>,
    pub n_layers: usize,
    pub n_kv: usize,
    pub head_dim: usize,
    pub vocab: usize,
    /// RoPE tables, one per layer kind that has its own (`Source::Cos::table` indexes
    /// it); the first is the global one.
    pub ropes: Vec<RopeSpec>,
    /// The host embedding table, when a step has an [`Source::Embedding`] input.
    pub embed: Option<EmbedTable>,
    /// Token id of padding rows (`Source::TokenIds`).
    pub pad_id: u32,
    /// Positions a dialog can hold.
    pub max_ctx: usize,
}

impl<G> Step<G> {
    /// Tensors of `split` whose input source matches `f`, as (split, index) pairs.
    pub fn inputs_where(&self, f: impl Fn(&Source) -> bool) -> Vec<At> {
        let mut v = Vec::new();
        for (s, sp) in self.splits.iter().enumerate() {
            for (i, src) in sp.inputs.iter().enumerate() {
                if f(src) {
                    v.push((s, i));
                }
            }
        }
        v
    }

    /// The output that ends a step: logits, or the hidden rows the head graph takes.
    pub fn result(&self) -> Option<(At, Sink)> {
        self.splits.iter().enumerate().find_map(|(s, sp)| {
            sp.outputs
                .iter()
                .enumerate()
                .find(|(_, k)| matches!(k, Sink::Hidden | Sink::Logits { .. }))
                .map(|(o, k)| ((s, o), *k))
        })
    }

    pub fn input_desc(&self, (s, i): At) -> &TensorDesc {
        &self.splits[s].desc.inputs[i]
    }

    pub fn output_desc(&self, (s, o): At) -> &TensorDesc {
        &self.splits[s].desc.outputs[o]
    }

    /// The name to report for this step: its first split's graph.
    pub fn name(&self) -> &str {
        &self.splits[0].desc.name
    }

    /// True when the step's past inputs hold a cache of their own or an alias of one.
    pub fn has_past(&self) -> bool {
        self.past > 0
    }

    /// Whether this step may take the next chunk at `pos` with `left` tokens to feed.
    pub fn admits(&self, pos: usize, left: usize) -> bool {
        match self.admit {
            Admit::FromEmpty => pos == 0,
            Admit::WholeRows => pos + self.rows <= self.past,
            Admit::Chunk { min_tokens } => {
                left >= min_tokens && pos + left.min(self.rows) <= self.past
            }
        }
    }
}

impl<G> Plan<G> {
    /// The one-token step (decode).
    pub fn decode(&self) -> &Step<G> {
        self.steps.last().expect("a plan has a decode step")
    }

    /// The step whose past inputs hold the cache when step `s` runs (itself, its owner,
    /// or, for a step without past inputs, none: it writes into the current home).
    pub fn home(&self, s: usize) -> Option<usize> {
        let st = &self.steps[s];
        st.has_past().then(|| st.cache_owner.unwrap_or(s))
    }

    /// The context ladder: the steps that hold a cache of their own and take the decode
    /// step's rows, smallest cache first (one entry, the decode step, without a ladder).
    pub fn rungs(&self) -> Vec<usize> {
        let rows = self.decode().rows;
        let mut v: Vec<usize> = (0..self.steps.len())
            .filter(|&s| {
                let st = &self.steps[s];
                st.rows == rows && st.has_past() && st.cache_owner.is_none()
            })
            .collect();
        v.sort_by_key(|&s| self.steps[s].past);
        if v.is_empty() {
            v.push(self.steps.len() - 1);
        }
        v
    }

    /// Where the cache lives before the first token: the smallest rung.
    pub fn first_home(&self) -> usize {
        self.rungs()[0]
    }

    /// True when some layer carries recurrent state: such a plan cannot rewind by
    /// position (the state of an earlier position is gone).
    pub fn has_state(&self) -> bool {
        !self.decode().states.is_empty()
    }

    /// The largest number of rows any step takes.
    pub fn max_rows(&self) -> usize {
        self.steps.iter().map(|s| s.rows).max().unwrap_or(1)
    }

    /// Dtype names of the decode step's activations (its first token input) and K/V cache.
    pub fn io_dtypes(&self) -> (&'static str, &'static str) {
        let d = self.decode();
        // The token input when it carries activations (an embedding row), else the mask.
        let act = d
            .inputs_where(|s| matches!(s, Source::Embedding))
            .into_iter()
            .chain(d.inputs_where(|s| matches!(s, Source::Mask(_))))
            .next()
            .map_or("UNKNOWN", |at| qnn_sys::dtype::name(d.input_desc(at).dtype));
        let kv = d
            .layers
            .first()
            .and_then(|l| l.past_key)
            .map_or(act, |k| qnn_sys::dtype::name(d.input_desc(k.at).dtype));
        (act, kv)
    }

    /// Host bytes one decode step writes into graph inputs, by formula from the
    /// descriptors: the token's row, its RoPE rows, the mask (one slot when persistent),
    /// one K and one V row per layer, and the head's hidden row. No term grows with the
    /// context except a non-persistent mask's.
    pub fn decode_bytes_formula(&self) -> usize {
        let d = self.decode();
        let es = |t: &TensorDesc| qnn_sys::dtype::size_of(t.dtype).unwrap_or(0);
        let mut n = 0;
        for (s, sp) in d.splits.iter().enumerate() {
            for (i, src) in sp.inputs.iter().enumerate() {
                let t = d.input_desc((s, i));
                n += match src {
                    Source::TokenIds | Source::Embedding => t.bytes(),
                    Source::Cos { width, .. } | Source::Sin { width, .. } => width * es(t),
                    // One slot opens; a window closes one more.
                    Source::Mask(m) if m.persistent => {
                        es(t) * (1 + usize::from(m.window.is_some()))
                    }
                    Source::Mask(_) => t.bytes(),
                    Source::PastKey(_) | Source::PastValue(_) => self.n_kv * self.head_dim * es(t),
                    // The state carried from the step before, whole (it is [channels, width]).
                    Source::StatePast(_) => t.bytes(),
                    Source::Link { .. } | Source::Unfed => 0,
                };
            }
        }
        if let Some(h) = &self.head {
            n += h.desc.inputs[0].bytes();
        }
        n
    }

    /// Every graph of the plan with its descriptor: steps' splits, then the head.
    pub fn graphs(&self) -> impl Iterator<Item = (&G, &GraphDesc)> {
        self.steps
            .iter()
            .flat_map(|s| s.splits.iter().map(|sp| (&sp.graph, &sp.desc)))
            .chain(self.head.iter().map(|h| (&h.graph, &h.desc)))
            .chain(self.verify_head.iter().map(|h| (&h.graph, &h.desc)))
    }
}

/// Dims right-aligned to rank 4 (Genie reads every tensor as [batch, height, width,
/// channel]; leading dims beyond four fold into the first).
pub fn dims4(t: &TensorDesc) -> [usize; 4] {
    let mut d = [1usize; 4];
    for (slot, v) in d.iter_mut().rev().zip(t.dims.iter().rev()) {
        *slot = *v as usize;
    }
    if t.dims.len() > 4 {
        d[0] = t.dims[..t.dims.len() - 3]
            .iter()
            .map(|&x| x as usize)
            .product();
    }
    d
}

/// Every tensor's dtype is one the host can read and write, and fits a client buffer.
pub fn check_dtypes(g: &GraphDesc) -> crate::error::Result<()> {
    use crate::error::Error;
    for t in g.inputs.iter().chain(&g.outputs) {
        if !crate::qnn::buffer_dtype_supported(t.dtype) {
            return Err(Error::graph(
                &g.name,
                format!(
                    "tensor {} has dtype {}, which qhx cannot read or write",
                    t.describe(),
                    qnn_sys::dtype::name(t.dtype)
                ),
            ));
        }
        if t.bytes() > u32::MAX as usize {
            return Err(Error::graph(
                &g.name,
                format!(
                    "tensor {} exceeds the 4 GiB client-buffer limit",
                    t.describe()
                ),
            ));
        }
    }
    Ok(())
}
