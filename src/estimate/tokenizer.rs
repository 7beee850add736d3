//! What a model's tokenizer holds for the whole of a prunemem run: it is
//! loaded before the first stage (`jobs::open_model`) and kept to the end.
//!
//! The tokenizers crate's BPE keeps three hash tables (hashbrown, through
//! ahash): the vocabulary (`String → u32`), its reverse (`u32 → String`), one
//! 32-byte slot each, and the merges (`(u32, u32) → (rank, id)`, 16 bytes),
//! plus two heap copies of every token string. A table of `n` entries has
//! `next_power_of_two(n · 8/7)` slots and one control byte per slot, so its
//! size is a step function of `n`. Measured on SmolLM2's tokenizer cut to
//! 1 024, 12 288, 24 576 and 49 152 tokens, with and without merges
//! (`prunemem eval`, release, the tokenizer category of `memory::tag`,
//! 2026-11-25): the tables of this model and the BPE cache's 802 832 bytes
//! (a 10 000-word table allocated with the tokenizer, the same for every
//! BPE and so counted in the base heap) give the measured category to the
//! byte at 49 152 and 24 576 tokens (6 242 368 and 3 522 624 bytes).
//!
//! The strings are small allocations (`memory::tag` leaves those to the
//! runtime category), one malloc chunk each: 32 bytes up to 24 bytes of
//! text, then 16-byte steps. Unigram and WordPiece tokenizers are taken as
//! BPE without merges.

use super::{Arch, Workload};
use crate::model::tokenizer_size::TokenizerSize;

/// Bytes a hash table of `entries` slots of `slot` bytes allocates
/// (hashbrown's sizing: 7/8 load, power-of-two buckets, a control byte per
/// bucket and one group of trailing control bytes).
fn table_bytes(entries: u64, slot: u64) -> u64 {
    if entries == 0 {
        return 0;
    }
    let buckets = if entries < 4 {
        4
    } else if entries < 8 {
        8
    } else {
        (entries * 8).div_ceil(7).next_power_of_two()
    };
    buckets * slot + buckets + 16
}

/// glibc's chunk for an allocation of `len` bytes.
fn malloc_chunk(len: u64) -> u64 {
    (len + 8).div_ceil(16).max(2) * 16
}

/// The tokenizer's resident bytes: its tables (the tokenizer category) and
/// its token strings (runtime), as `(tables, strings)`.
pub(super) fn resident(size: &TokenizerSize) -> (u64, u64) {
    let tables = 2 * table_bytes(size.entries, 32) + table_bytes(size.merges, 16);
    let mean = size.string_bytes.checked_div(size.entries).unwrap_or(0);
    (tables, 2 * size.entries * malloc_chunk(mean))
}

/// The tokenizer of a run: the one counted from the model's
/// `tokenizer.json`, or, with none, a BPE of the architecture's vocabulary
/// with as many merges and tokens of 6 bytes (said in a note).
pub(super) fn of_run(
    a: &Arch,
    known: Option<TokenizerSize>,
    notes: &mut Vec<String>,
) -> TokenizerSize {
    known.unwrap_or_else(|| {
        notes.push(format!(
            "tokenizer: no tokenizer.json read; taken as a BPE of {} tokens and as many merges",
            a.vocab
        ));
        TokenizerSize {
            entries: a.vocab,
            merges: a.vocab,
            string_bytes: 6 * a.vocab,
        }
    })
}

/// What the run's tokenizer holds for the whole run, `(tables, strings)`.
pub(super) fn held_by_run(a: &Arch, w: &Workload, notes: &mut Vec<String>) -> (u64, u64) {
    resident(&of_run(a, w.tokenizer, notes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smollm2_s_tables_are_what_the_category_measured_less_the_cache() {
        let smollm2 = TokenizerSize {
            entries: 49_152,
            merges: 48_900,
            string_bytes: 0,
        };
        // Measured tokenizer category at the evaluation, less the BPE cache.
        assert_eq!(resident(&smollm2).0, 6_242_368 - 802_832);
        let cut = TokenizerSize {
            entries: 24_576,
            merges: 24_324,
            string_bytes: 0,
        };
        assert_eq!(resident(&cut).0, 3_522_624 - 802_832);
        assert_eq!(table_bytes(0, 32), 0);
        assert_eq!(table_bytes(7, 32), 8 * 33 + 16);
        assert_eq!(malloc_chunk(6), 32);
        assert_eq!(malloc_chunk(25), 48);
        // The synthetic models' byte-level tokenizer: about 50 kB.
        let json = crate::model::tokenizer::byte_level_tokenizer_json(300).to_string();
        let bytes = TokenizerSize::from_json(&json).unwrap();
        assert!((256..=300).contains(&bytes.entries), "{bytes:?}");
        let (tables, strings) = resident(&bytes);
        assert!(tables + strings < 64 << 10, "{tables} + {strings}");
    }

    /// Every prunemem phase on the CPU holds the tokenizer: a counted one
    /// moves the estimate by its own bytes; without one the architecture's
    /// vocabulary is assumed and a note says so.
    #[test]
    fn the_run_s_tokenizer_is_in_every_phase_of_the_estimate() {
        use super::super::{Task, Workload, estimate, presets};
        use crate::memory::tag::Category;
        let arch = presets::load("smollm2-135m").unwrap();
        for task in [Task::Wanda, Task::Inference, Task::Train, Task::GradProbe] {
            let mut w = Workload::new(task);
            (w.nsamples, w.seqlen, w.eval_windows) = (8, 128, 4);
            let guessed = estimate(&arch, &w).unwrap();
            assert!(
                guessed
                    .notes
                    .iter()
                    .any(|n| n.contains("no tokenizer.json")),
                "{task:?}"
            );
            let small = TokenizerSize {
                entries: 259,
                merges: 0,
                string_bytes: 600,
            };
            w.tokenizer = Some(small);
            let counted = estimate(&arch, &w).unwrap();
            assert!(
                !counted
                    .notes
                    .iter()
                    .any(|n| n.contains("no tokenizer.json"))
            );
            let (tables, strings) = resident(&small);
            let of_arch = resident(&of_run(&arch, None, &mut Vec::new()));
            for (g, c) in guessed.phases.iter().zip(&counted.phases) {
                let held = |p: &super::super::Phase| {
                    p.components
                        .iter()
                        .filter(|c| {
                            c.category == Category::Tokenizer && c.name.starts_with("tokenizer")
                        })
                        .map(|c| c.bytes)
                        .sum::<u64>()
                };
                assert_eq!(held(c), tables, "{task:?} {}", c.name);
                assert_eq!(held(g), of_arch.0, "{task:?} {}", g.name);
                assert_eq!(
                    g.total() - c.total(),
                    of_arch.0 + of_arch.1 - tables - strings,
                    "{task:?} {}",
                    c.name
                );
            }
        }
    }
}
