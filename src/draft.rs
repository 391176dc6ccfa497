//! A draft model (`--spec draft BUNDLE`): a second, smaller or lower-precision bundle with
//! the same tokenizer drafts greedily over its own cache; the target verifies.
//!
//! The draft's cache follows the target's text lazily: before drafting it goes back to
//! the longest prefix it shares with the text and feeds the rest (the first time, the
//! whole prompt through its own prefill). Its last drafted token is never fed, so a
//! fully kept draft costs it nothing to catch up but the target's own pick.

use crate::error::{Error, Result};
use crate::load::{LoadOptions, Loaded, Model};
use crate::runner::Runner;
use crate::sampler;
use std::sync::Arc;

pub struct DraftModel {
    /// The draft bundle's contexts, kept while its runner uses them.
    model: Arc<Model>,
    run: Runner,
    /// The ids the draft's cache holds, in order.
    fed: Vec<u32>,
    logits: Vec<f32>,
    max_ctx: usize,
    /// For errors: the draft bundle as the user named it.
    name: String,
    /// Draft graph executes so far (its prompt chunks included).
    pub executes: usize,
}

impl DraftModel {
    /// Load the draft bundle at `path` (a manifest or Genie config, its artifacts beside
    /// it) onto the target's runtime, so both run on the one backend, and check it drafts
    /// for `target`.
    pub fn load(path: &std::path::Path, target: &Loaded, opts: &LoadOptions) -> Result<DraftModel> {
        let loaded = DraftModel::load_bundle(path, target, opts)?;
        DraftModel::new(loaded.model(), target.model(), &path.display().to_string())
    }

    /// The draft bundle at `path` loaded onto the target's runtime and checked against
    /// it, for several drafters (one per session) to share.
    pub fn load_bundle(
        path: &std::path::Path,
        target: &Loaded,
        opts: &LoadOptions,
    ) -> Result<Loaded> {
        let root = path.parent().unwrap_or(std::path::Path::new("."));
        let spec = crate::bundle::Spec::load(path, root)?;
        spec.check_files()?;
        let loaded = Loaded::load_on(&spec, target.rt(), opts)?;
        DraftModel::new(loaded.model(), target.model(), &path.display().to_string())?;
        Ok(loaded)
    }

    /// The draft model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// A drafter over `draft`, checked against the `target` it drafts for: the same vocab
    /// and the same ids for the same text (one tokenizer), so a drafted id means to the
    /// target what it meant to the draft.
    pub fn new(draft: &Arc<Model>, target: &Model, name: &str) -> Result<DraftModel> {
        let bad = |msg: String| Error::Graph {
            graph: name.to_string(),
            msg,
        };
        let (dv, tv) = (draft.plan.vocab, target.plan.vocab);
        if dv != tv {
            return Err(bad(format!(
                "the draft bundle's vocab is {dv} tokens, the target's {tv}: a draft needs the target's tokenizer"
            )));
        }
        let probe = "The draft and the target read this text alike: 0123, é, 東京.";
        let (a, b) = (
            draft.tokenizer.encode_raw(probe)?,
            target.tokenizer.encode_raw(probe)?,
        );
        if a != b {
            return Err(bad(
                "the draft bundle's tokenizer splits text differently from the target's: a draft needs the target's tokenizer".into(),
            ));
        }
        Ok(DraftModel {
            model: Arc::clone(draft),
            run: Runner::new(&draft.plan)?,
            fed: Vec::new(),
            logits: vec![0.0; dv],
            max_ctx: draft.max_ctx,
            name: name.to_string(),
            executes: 0,
        })
    }

    /// Forget the draft's cache (the target's was reset).
    pub fn reset(&mut self) {
        let _ = self.run.reset();
        self.fed.clear();
    }

    /// Up to `max` greedy draft tokens after `history` (the target's text, its last token
    /// the current one), stopping before a pick the draft gives less than `p_min`.
    pub fn draft(&mut self, history: &[u32], max: usize, p_min: f32) -> Result<Vec<u32>> {
        let n = history.len();
        let max = max.min(self.max_ctx.saturating_sub(n));
        if max == 0 || n == 0 {
            return Ok(Vec::new());
        }
        let shared = self
            .fed
            .iter()
            .zip(history)
            .take_while(|(a, b)| a == b)
            .count()
            .min(n - 1);
        if self.run.rewind(shared).is_err() {
            // Layers with state cannot go back: start the draft's cache again.
            self.run.reset()?;
            self.fed.clear();
        }
        let from = self.run.pos();
        self.fed.truncate(from);
        self.feed(&history[from..])?;
        let mut d = Vec::with_capacity(max);
        loop {
            self.run.logits()?.read_f32(0, &mut self.logits);
            let Some((tok, p)) = top(&self.logits) else {
                // Non-finite draft logits: draft nothing more (the target decides anyway).
                break;
            };
            if p < p_min {
                break;
            }
            d.push(tok);
            if d.len() == max {
                break;
            }
            self.feed(&[tok])?;
        }
        Ok(d)
    }

    fn feed(&mut self, ids: &[u32]) -> Result<()> {
        let before = self.run.executes();
        self.run
            .feed(ids, &|| false, None)
            .map_err(|e| Error::Graph {
                graph: self.name.clone(),
                msg: format!("draft model: {e}"),
            })?;
        self.executes += self.run.executes() - before;
        self.fed.extend_from_slice(ids);
        Ok(())
    }
}

/// The argmax of `logits` and its softmax probability; None when a value is not finite.
fn top(logits: &[f32]) -> Option<(u32, f32)> {
    let tok = sampler::argmax_checked(logits).ok()?;
    let m = logits[tok as usize];
    let z: f64 = logits.iter().map(|&l| ((l - m) as f64).exp()).sum();
    Some((tok, (1.0 / z) as f32))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_top_pick_carries_its_softmax_probability() {
        let (t, p) = super::top(&[0.0, 2.0, 0.0]).unwrap();
        assert_eq!(t, 1);
        let e2 = 2f64.exp();
        assert!((p as f64 - e2 / (e2 + 2.0)).abs() < 1e-6);
        assert!(super::top(&[0.0, f32::NAN]).is_none());
    }
}
