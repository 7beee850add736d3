//! How big a `tokenizer.json` is once loaded: its vocabulary's entries, its
//! merges and the bytes of its token strings, counted from the file without
//! building the tokenizer, so the estimator can say what a model's tokenizer
//! holds for the whole run (6.0 MiB of tables for SmolLM2's 49 152 tokens,
//! where the byte-level tokenizers of synthetic models hold 50 kB).

use std::fmt;
use std::io::BufReader;
use std::path::Path;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

use super::ModelError;

/// What a tokenizer's model keeps: `entries` tokens (its vocabulary, and
/// the reverse map, one string copy each), `merges` merge rules (BPE), and
/// the bytes of its token strings (the sum of their UTF-8 lengths).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenizerSize {
    pub entries: u64,
    pub merges: u64,
    pub string_bytes: u64,
}

impl TokenizerSize {
    /// Counts `tokenizer.json` at `path`, streaming: nothing of the file is
    /// kept but the counts.
    pub fn read(path: &Path) -> Result<Self, ModelError> {
        let file = crate::input::open(path, crate::input::TOKENIZER_LIMIT, "a tokenizer.json")?;
        let parsed: File = serde_json::from_reader(BufReader::new(file))
            .map_err(|e| ModelError::Tokenizer(format!("{}: {e}", path.display())))?;
        Ok(parsed.size())
    }

    /// Counts a `tokenizer.json` given as text.
    pub fn from_json(text: &str) -> Result<Self, ModelError> {
        let parsed: File = serde_json::from_str(text)
            .map_err(|e| ModelError::Tokenizer(format!("invalid tokenizer.json: {e}")))?;
        Ok(parsed.size())
    }
}

#[derive(Deserialize)]
struct File {
    model: Model,
}

impl File {
    fn size(&self) -> TokenizerSize {
        TokenizerSize {
            entries: self.model.vocab.items,
            merges: self.model.merges.items,
            string_bytes: self.model.vocab.string_bytes,
        }
    }
}

#[derive(Deserialize)]
struct Model {
    #[serde(default)]
    vocab: Count,
    #[serde(default)]
    merges: Count,
}

/// Items of a JSON map (`{"token": id}`: BPE, WordPiece) or array
/// (`[["piece", score]]`: Unigram; merges), and the bytes of the map's keys
/// or of each array item's leading string.
#[derive(Default)]
struct Count {
    items: u64,
    string_bytes: u64,
}

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(CountVisitor)
    }
}

struct CountVisitor;

impl<'de> Visitor<'de> for CountVisitor {
    type Value = Count;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a map or an array")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Count, A::Error> {
        let mut c = Count::default();
        while let Some(key) = map.next_key::<ItemLen>()? {
            map.next_value::<IgnoredAny>()?;
            c.items += 1;
            c.string_bytes += key.0;
        }
        Ok(c)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Count, A::Error> {
        let mut c = Count::default();
        while let Some(item) = seq.next_element::<ItemLen>()? {
            c.items += 1;
            c.string_bytes += item.0;
        }
        Ok(c)
    }
}

/// A map key or an array item, read without keeping it: a string (its
/// UTF-8 length), an array whose first element is a string (a Unigram piece
/// with its score), or anything else (0).
struct ItemLen(u64);

impl<'de> Deserialize<'de> for ItemLen {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ItemLen;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array item")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<ItemLen, E> {
                Ok(ItemLen(s.len() as u64))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ItemLen, A::Error> {
                let first = seq.next_element::<ItemLen>()?.map_or(0, |l| l.0);
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(ItemLen(first))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ItemLen, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(ItemLen(0))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<ItemLen, E> {
                Ok(ItemLen(0))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<ItemLen, E> {
                Ok(ItemLen(0))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<ItemLen, E> {
                Ok(ItemLen(0))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_a_bpe_vocabulary_its_merges_and_its_strings() {
        let json = r#"{"version":"1.0","added_tokens":[{"id":0,"content":"<s>"}],
            "model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2,"é":3},
            "merges":["a b",["ab","b"]]}}"#;
        let s = TokenizerSize::from_json(json).unwrap();
        assert_eq!(
            s,
            TokenizerSize {
                entries: 4,
                merges: 2,
                string_bytes: 1 + 1 + 2 + 2
            }
        );
    }

    #[test]
    fn counts_a_unigram_vocabulary_and_refuses_a_vocabulary_that_is_neither() {
        let json = r#"{"model":{"type":"Unigram","vocab":[["<unk>",0.0],["▁the",-3.2]]}}"#;
        let s = TokenizerSize::from_json(json).unwrap();
        assert_eq!((s.entries, s.merges, s.string_bytes), (2, 0, 5 + 6));
        assert!(TokenizerSize::from_json(r#"{"model":{"vocab":7}}"#).is_err());
    }
}
