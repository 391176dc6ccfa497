//! Tokenizer wrapper (HF `tokenizer.json`) and UTF-8-safe streaming detokenization.

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
}

impl Tokenizer {
    pub fn load(path: &Path) -> Result<Tokenizer> {
        if !path.exists() {
            return Err(Error::Tokenizer {
                path: path.to_path_buf(),
                msg: "file not found".into(),
            });
        }
        let inner = tokenizers::Tokenizer::from_file(path).map_err(|e| Error::Tokenizer {
            path: path.to_path_buf(),
            msg: format!("cannot parse: {e}"),
        })?;
        Ok(Tokenizer {
            inner,
            path: path.to_path_buf(),
        })
    }

    fn err(&self, what: &str, e: impl std::fmt::Display) -> Error {
        Error::Tokenizer {
            path: self.path.clone(),
            msg: format!("{what}: {e}"),
        }
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Encode with the tokenizer's own special-token handling (its post-processor may add
    /// BOS); then prepend `bos` when given and not already first.
    pub fn encode(&self, text: &str, bos: Option<u32>) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, true)
            .map_err(|e| self.err("encode", e))?;
        let mut ids = enc.get_ids().to_vec();
        if let Some(b) = bos {
            if ids.first() != Some(&b) {
                ids.insert(0, b);
            }
        }
        Ok(ids)
    }

    /// Encode without the post-processor's special tokens (HF `add_special_tokens=False`),
    /// as chat templates are tokenized.
    pub fn encode_raw(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| self.err("encode", e))?;
        Ok(enc.get_ids().to_vec())
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, false)
            .map_err(|e| self.err("decode", e))
    }

    pub fn token_to_piece(&self, id: u32) -> String {
        self.inner
            .id_to_token(id)
            .unwrap_or_else(|| format!("<{id}>"))
    }

    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// A streaming decoder: each step returns the text that became final.
    pub fn stream(&self) -> TextStream<'_> {
        TextStream {
            inner: self.inner.decode_stream(false),
            tok: self,
        }
    }
}

/// Incremental detokenizer: holds back text while it ends in an incomplete UTF-8 sequence,
/// so that the concatenated chunks equal the one-shot decode.
pub struct TextStream<'a> {
    inner: tokenizers::DecodeStream<
        'a,
        tokenizers::ModelWrapper,
        tokenizers::NormalizerWrapper,
        tokenizers::PreTokenizerWrapper,
        tokenizers::PostProcessorWrapper,
        tokenizers::DecoderWrapper,
    >,
    tok: &'a Tokenizer,
}

impl TextStream<'_> {
    pub fn step(&mut self, id: u32) -> Result<Option<String>> {
        self.inner.step(id).map_err(|e| self.tok.err("decode", e))
    }
}
