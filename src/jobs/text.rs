//! Text for jobs: reading a [`TextSource`], tokenising it, and cutting it
//! into calibration or evaluation windows the way each method's reference
//! cuts them.

use super::JobError;
use super::config::TextSource;
use crate::data::windows::{calibration_from_documents, calibration_windows, eval_windows};
use crate::data::{self, Corpus};
use crate::model::tokenizer::Tokenizer;
use crate::prune::gradprobe::sliding_windows;

/// The text of `src` as one string (documents joined by blank lines).
fn read(src: &TextSource) -> Result<String, JobError> {
    Ok(match data::read_corpus(&src.path, src.lines)? {
        Corpus::Text(text) => text,
        Corpus::Documents(docs) => docs.join("\n\n"),
    })
}

/// Tokenises `src` as one text; also returns the bytes of text tokenised.
pub fn tokenize(tok: &Tokenizer, src: &TextSource) -> Result<(Vec<u32>, u64), JobError> {
    let text = read(src)?;
    let ids = tok.encode(&text)?;
    tok.check_unknown(&ids, &crate::input::shown(&src.path))?;
    let bytes = text.len() as u64;
    drop(text);
    // Tokenisation leaves many small freed chunks; hand their pages back.
    crate::memory::alloc::trim();
    Ok((ids, bytes))
}

/// Non-overlapping evaluation windows of `src` (the first `limit`).
pub fn evaluation(
    tok: &Tokenizer,
    src: &TextSource,
    seqlen: usize,
    limit: Option<usize>,
) -> Result<(Vec<Vec<u32>>, u64), JobError> {
    let (tokens, bytes) = tokenize(tok, src)?;
    Ok((eval_windows(&tokens, seqlen, limit)?, bytes))
}

/// Wanda's and SparseGPT's calibration: `nsamples` windows at random
/// offsets (`random.seed(seed)` semantics); a `.jsonl` is sampled per
/// document like C4. Also returns the bytes of text tokenised at once.
pub fn calibration(
    tok: &Tokenizer,
    src: &TextSource,
    nsamples: usize,
    seqlen: usize,
    seed: u64,
) -> Result<(Vec<Vec<u32>>, u64), JobError> {
    Ok(match data::read_corpus(&src.path, src.lines)? {
        Corpus::Text(text) => (
            calibration_windows(&tok.encode(&text)?, nsamples, seqlen, seed)?,
            text.len() as u64,
        ),
        Corpus::Documents(docs) => {
            let encode = |s: &str| tok.encode(s).map_err(|e| e.to_string());
            let bytes = docs.iter().map(|d| d.len() as u64).max().unwrap_or(0);
            (
                calibration_from_documents(&docs, &encode, nsamples, seqlen, seed)?,
                bytes,
            )
        }
    })
}

/// GradProbe's calibration: `count` windows of `seqlen + 1` tokens every
/// `stride` tokens from the start (its `prepare_calibration_data`).
pub fn sliding(
    tok: &Tokenizer,
    src: &TextSource,
    seqlen: usize,
    stride: usize,
    count: usize,
) -> Result<Vec<Vec<u32>>, JobError> {
    let tokens = tok.encode(&read(src)?)?;
    Ok(sliding_windows(&tokens, seqlen, stride, count)?)
}
