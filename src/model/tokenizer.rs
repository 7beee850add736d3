//! Tokenizers: Hugging Face `tokenizer.json` through the `tokenizers` crate,
//! and the builder that writes a `tokenizer.json` from GGUF metadata.
//!
//! A GGUF stores a byte-level BPE tokenizer as its vocabulary, merges, token
//! types and a pre-tokenizer *name* (`tokenizer.ggml.pre`). The name decides
//! how text is split before BPE; [`pre_tokenizer_for`] maps the names
//! llama.cpp uses (`llama-vocab.cpp`) to the equivalent Hugging Face
//! pre-tokenizer, so the written file encodes exactly as the original
//! `tokenizer.json` of that model family does.

use std::path::Path;

use serde_json::{Value, json};

use super::ModelError;
use super::gguf::GgufFile;
use super::tokenizer_size::TokenizerSize;
use crate::input;
use crate::memory::tag::{self, Category};

/// Text to token ids, as `tokenizer(text)` does in transformers (special
/// tokens added by the post-processor, e.g. a BOS for Llama 3).
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// What its model holds, counted from the file (`None`: built from
    /// text, or a file the counter could not read).
    size: Option<TokenizerSize>,
}

/// The tokenizers crate's parser, its panics on malformed files (a decoder
/// of the wrong shape) turned into errors.
fn parse(text: &str) -> Result<tokenizers::Tokenizer, tokenizers::Error> {
    match input::caught(|| text.parse::<tokenizers::Tokenizer>()) {
        Ok(parsed) => parsed,
        Err(why) => Err(format!("the tokenizers library failed on it ({why})").into()),
    }
}

impl Tokenizer {
    pub fn from_file(path: &Path) -> Result<Self, ModelError> {
        // Its vocabulary and merges live as long as the run (6.1 MiB for
        // SmolLM2's 49 152 tokens): charged to the tokenizer, not untagged.
        let _tag = tag::tag(Category::Tokenizer);
        let err =
            |e: &dyn std::fmt::Display| ModelError::Tokenizer(format!("{}: {e}", path.display()));
        // Read once: the tokenizer and the estimator's counter parse the same text.
        let text = input::read_string(path, input::TOKENIZER_LIMIT, "a tokenizer.json")?;
        let inner: tokenizers::Tokenizer = parse(&text).map_err(|e: tokenizers::Error| {
            let e = e.to_string();
            // serde's words for "none of the model types matched".
            if e.contains("untagged enum") {
                let kind = serde_json::from_str::<Value>(&text)
                    .ok()
                    .and_then(|v| v["model"]["type"].as_str().map(input::escape));
                err(&format!(
                    "its model ({}) is not one this build reads: BPE, WordPiece, WordLevel or Unigram",
                    kind.as_deref().unwrap_or("no \"type\"")
                ))
            } else {
                err(&e)
            }
        })?;
        let size = TokenizerSize::from_json(&text).ok();
        Ok(Self { inner, size })
    }

    /// Refuses a tokenizer that can produce ids the model has no embedding
    /// row for (a tokenizer.json from another model, say).
    pub fn check_vocab(&self, vocab_size: usize) -> Result<(), ModelError> {
        let _tag = tag::tag(Category::Tokenizer);
        let max = self.inner.get_vocab(true).into_values().max();
        match max {
            Some(id) if id as usize >= vocab_size => Err(ModelError::Tokenizer(format!(
                "tokenizer.json has token id {id}, beyond the model's vocabulary of {vocab_size} (a tokenizer from another model?)"
            ))),
            _ => Ok(()),
        }
    }

    pub fn from_json(text: &str) -> Result<Self, ModelError> {
        let inner: tokenizers::Tokenizer = parse(text)
            .map_err(|e| ModelError::Tokenizer(format!("invalid tokenizer.json: {e}")))?;
        let size = TokenizerSize::from_json(text).ok();
        Ok(Self { inner, size })
    }

    /// Encodes `text` with the tokenizer's special-token template. Long
    /// texts are encoded in pieces cut only where no pre-tokenizer regex can
    /// join across the cut (see [`safe_cuts`]), with the same ids as one
    /// call and a fraction of its memory (the tokenizers crate holds tens of
    /// bytes per input byte while encoding).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, ModelError> {
        let _tag = tag::tag(Category::Tokenizer);
        let err = |e: tokenizers::Error| ModelError::Tokenizer(e.to_string());
        if text.len() <= CHUNK_BYTES {
            return Ok(self
                .inner
                .encode(text, true)
                .map_err(err)?
                .get_ids()
                .to_vec());
        }
        // The template's own tokens (a BOS for Llama 3, none for GPT-2 style).
        let mut ids = self.inner.encode("", true).map_err(err)?.get_ids().to_vec();
        let mut start = 0;
        for cut in safe_cuts(text, CHUNK_BYTES).into_iter().chain([text.len()]) {
            if cut > start {
                let piece = self.inner.encode(&text[start..cut], false).map_err(err)?;
                ids.extend_from_slice(piece.get_ids());
                start = cut;
            }
        }
        Ok(ids)
    }

    /// The id of its unknown token, where its model has one.
    pub fn unk_id(&self) -> Option<u32> {
        use tokenizers::models::ModelWrapper;
        let token = match self.inner.get_model() {
            ModelWrapper::BPE(m) => m.get_unk_token().clone()?,
            ModelWrapper::WordPiece(m) => m.unk_token.clone(),
            ModelWrapper::WordLevel(m) => m.unk_token.clone(),
            ModelWrapper::Unigram(_) => return None,
        };
        self.inner.token_to_id(&token)
    }

    /// Refuses a tokenisation that is mostly the unknown token: a tokenizer
    /// that does not fit the text would give a perplexity near 1 (every
    /// target the same token) or a calibration of nothing.
    pub fn check_unknown(&self, ids: &[u32], what: &str) -> Result<(), ModelError> {
        let Some(unk) = self.unk_id() else {
            return Ok(());
        };
        let unknown = ids.iter().filter(|&&id| id == unk).count();
        if ids.len() >= 16 && unknown * 2 > ids.len() {
            return Err(ModelError::Tokenizer(format!(
                "{unknown} of {} tokens of {what} ({:.1}%) are the unknown token: this tokenizer does not fit the text",
                ids.len(),
                100.0 * unknown as f64 / ids.len() as f64
            )));
        }
        Ok(())
    }

    /// Its vocabulary, merges and token strings, for the estimator.
    pub fn size(&self) -> Option<TokenizerSize> {
        self.size
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String, ModelError> {
        self.inner
            .decode(ids, false)
            .map_err(|e| ModelError::Tokenizer(e.to_string()))
    }
}

/// Bytes per piece when encoding long texts.
const CHUNK_BYTES: usize = 32 * 1024;

/// Byte offsets, about `every` bytes apart, where a text can be cut without
/// changing its pre-tokenisation: right after a `\n` that is followed by a
/// non-whitespace character, or by one space and then a non-whitespace
/// character. Whitespace runs end at such a `\n` either way (`\s+(?!\S)`
/// backtracks off a space that precedes a word), and no pattern starts with
/// a newline, so both sides split the same in one call or two.
pub fn safe_cuts(text: &str, every: usize) -> Vec<usize> {
    let b = text.as_bytes();
    let mut cuts = Vec::new();
    let mut next = every;
    let mut i = every.min(b.len());
    while i < b.len() {
        if i >= next && b[i - 1] == b'\n' {
            let mut chars = text[i..].chars();
            let ok = match chars.next() {
                Some(' ') => chars.next().is_some_and(|c| !c.is_whitespace()),
                Some(c) => !c.is_whitespace(),
                None => false,
            };
            if ok {
                cuts.push(i);
                next = i + every;
            }
        }
        i += 1;
    }
    cuts
}

const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn byte_level(use_regex: bool) -> Value {
    json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex})
}

fn split_then_bytes(regex: &str) -> Value {
    json!({"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false},
        byte_level(false),
    ]})
}

/// The Hugging Face pre-tokenizer equivalent to llama.cpp's pre-tokenizer
/// `name`, and whether the BPE model ignores merges for whole-vocab words
/// (Llama 3 style).
pub fn pre_tokenizer_for(name: &str) -> Result<(Value, bool), String> {
    Ok(match name {
        // llama.cpp: "\p{N}" then the GPT-2 regex.
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva" => (
            json!({"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": true},
                byte_level(true),
            ]}),
            false,
        ),
        // llama.cpp: the GPT-2 regex alone.
        "gpt2" | "gpt-2" | "default" | "mpt" | "olmo" | "jais" => (byte_level(true), false),
        "llama-bpe" | "llama3" | "llama-v3" | "falcon3" | "smaug-bpe" | "dbrx" => {
            (split_then_bytes(LLAMA3_SPLIT), true)
        }
        "qwen2" | "deepseek-r1-qwen" | "megrez" => (split_then_bytes(QWEN2_SPLIT), false),
        other => {
            return Err(format!(
                "pre-tokenizer '{other}' is not supported (supported: smollm, starcoder, gpt2, llama-bpe, qwen2 and their aliases)"
            ));
        }
    })
}

fn strings(gguf: &GgufFile, key: &str) -> Result<Vec<String>, ModelError> {
    let arr = gguf
        .get(key)
        .and_then(|v| v.as_array())
        .ok_or_else(|| ModelError::Tokenizer(format!("GGUF has no '{key}' array")))?;
    arr.iter()
        .map(|v| {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| ModelError::Tokenizer(format!("'{key}' holds a non-string")))
        })
        .collect()
}

/// The special-token ids and template flags a GGUF declares.
pub struct TokenizerFacts {
    pub bos: Option<(u32, String)>,
    pub eos: Option<(u32, String)>,
    pub add_bos: bool,
    pub chat_template: Option<String>,
}

/// Builds `tokenizer.json` (and the facts `tokenizer_config.json` needs)
/// from a GGUF's metadata.
pub fn tokenizer_json_from_gguf(gguf: &GgufFile) -> Result<(Value, TokenizerFacts), ModelError> {
    let model = gguf
        .get("tokenizer.ggml.model")
        .and_then(|v| v.as_str())
        .unwrap_or("");
    if model != "gpt2" {
        return Err(ModelError::Tokenizer(format!(
            "GGUF tokenizer model '{model}' is not supported for conversion (supported: gpt2 byte-level BPE); \
             put the model's own tokenizer.json in the output folder instead"
        )));
    }
    let tokens = strings(gguf, "tokenizer.ggml.tokens")?;
    let merges = strings(gguf, "tokenizer.ggml.merges")?;
    let types: Vec<i64> = gguf
        .get("tokenizer.ggml.token_type")
        .and_then(|v| v.as_array())
        .map(|a| {
            a.iter()
                .map(|v| v.as_u64().map(|x| x as i64).unwrap_or(1))
                .collect()
        })
        .unwrap_or_else(|| vec![1; tokens.len()]);
    let pre = gguf
        .get("tokenizer.ggml.pre")
        .and_then(|v| v.as_str())
        .unwrap_or("default");
    let (pre_tokenizer, ignore_merges) = pre_tokenizer_for(pre).map_err(ModelError::Tokenizer)?;

    let mut vocab = serde_json::Map::with_capacity(tokens.len());
    for (id, t) in tokens.iter().enumerate() {
        vocab.insert(t.clone(), json!(id));
    }
    // 3 = CONTROL (special), 4 = USER_DEFINED (matched whole, not special).
    let added: Vec<Value> = tokens
        .iter()
        .zip(&types)
        .enumerate()
        .filter(|(_, (_, ty))| **ty == 3 || **ty == 4)
        .map(|(id, (t, ty))| {
            json!({"id": id, "content": t, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": *ty == 3})
        })
        .collect();
    let token_at = |key: &str| -> Option<(u32, String)> {
        let id = gguf.get(key)?.as_u64()? as usize;
        tokens.get(id).map(|t| (id as u32, t.clone()))
    };
    let facts = TokenizerFacts {
        bos: token_at("tokenizer.ggml.bos_token_id"),
        eos: token_at("tokenizer.ggml.eos_token_id"),
        add_bos: gguf
            .get("tokenizer.ggml.add_bos_token")
            .and_then(|v| v.as_bool())
            .unwrap_or(false),
        chat_template: gguf
            .get("tokenizer.chat_template")
            .and_then(|v| v.as_str())
            .map(str::to_string),
    };
    let post_processor = match (&facts.bos, facts.add_bos) {
        (Some((id, bos)), true) => json!({
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos.as_str(): {"id": bos, "ids": [id], "tokens": [bos]}}
        }),
        _ => {
            json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true})
        }
    };
    let json = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": ignore_merges, "vocab": vocab, "merges": merges,
        }
    });
    Ok((json, facts))
}

/// `tokenizer_config.json` that makes transformers use `tokenizer.json` as
/// written (no class-specific normaliser or pre-tokenizer substituted).
pub fn tokenizer_config_json(facts: &TokenizerFacts, max_len: usize) -> Value {
    let mut v = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": facts.add_bos,
        "add_eos_token": false,
        "model_max_length": max_len,
        "clean_up_tokenization_spaces": false,
    });
    if let Some((_, t)) = &facts.bos {
        v["bos_token"] = json!(t);
    }
    if let Some((_, t)) = &facts.eos {
        v["eos_token"] = json!(t);
    }
    if let Some(t) = &facts.chat_template {
        v["chat_template"] = json!(t);
    }
    v
}

/// GPT-2's byte-to-character table: printable bytes stand for themselves,
/// the others are shifted above U+0100 so every byte has a visible symbol.
pub fn bytes_to_unicode() -> Vec<char> {
    let mut table = vec!['\0'; 256];
    let mut shifted = 0u32;
    for b in 0..256u32 {
        let printable =
            (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        table[b as usize] = if printable {
            char::from_u32(b).unwrap_or('?')
        } else {
            shifted += 1;
            char::from_u32(255 + shifted).unwrap_or('?')
        };
    }
    table
}

/// A byte-level tokenizer with no merges: ids 0..255 are bytes, 256/257/258
/// are `<s>`, `</s>`, `<pad>`, and ids up to `vocab` are unused
/// placeholders. Used by synthetic models.
pub fn byte_level_tokenizer_json(vocab: usize) -> Value {
    let mut map = serde_json::Map::new();
    for (id, c) in bytes_to_unicode().into_iter().enumerate() {
        map.insert(c.to_string(), json!(id));
    }
    let specials = ["<s>", "</s>", "<pad>"];
    for (k, s) in specials.iter().enumerate() {
        map.insert(s.to_string(), json!(256 + k));
    }
    for id in 259..vocab {
        map.insert(format!("<unused_{id}>"), json!(id));
    }
    let added: Vec<Value> = specials
        .iter()
        .enumerate()
        .map(|(k, s)| {
            json!({"id": 256 + k, "content": s, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null, "pre_tokenizer": byte_level(true),
        "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": false, "vocab": map, "merges": []}
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smollm_splits_digits_like_llama_cpp() {
        let (pre, ignore) = pre_tokenizer_for("smollm").unwrap();
        assert!(!ignore);
        assert_eq!(pre["pretokenizers"][0]["type"], "Digits");
        assert_eq!(pre["pretokenizers"][0]["individual_digits"], true);
        assert!(pre_tokenizer_for("llama-bpe").unwrap().1);
        let err = pre_tokenizer_for("chameleon").unwrap_err();
        assert!(err.contains("chameleon"));
    }
}
