//! Token windows: non-overlapping evaluation windows, and seeded calibration
//! windows drawn exactly as the reference scripts draw them (`get_wikitext2`
//! for one text, `get_c4` for documents).

use super::DataError;
use super::pyrandom::PyRandom;

/// The default window length, and the cap every run applies.
pub const DEFAULT_SEQLEN: usize = 2048;

/// `seqlen` for a run: the request (or 2048), capped at the model's maximum
/// positions. Returns the warning to show when it was capped.
pub fn resolve_seqlen(
    requested: Option<usize>,
    max_positions: usize,
) -> Result<(usize, Option<String>), DataError> {
    let want = requested.unwrap_or(DEFAULT_SEQLEN);
    if want == 0 {
        return Err(DataError::Invalid("--seqlen must be at least 1".into()));
    }
    if want > max_positions {
        return Ok((
            max_positions,
            Some(format!(
                "seqlen {want} exceeds the model's max_position_embeddings ({max_positions}); using {max_positions}"
            )),
        ));
    }
    Ok((want, None))
}

/// Non-overlapping windows of `seqlen` tokens from the start (stride =
/// seqlen, remainder dropped), the first `limit` of them if given — as
/// `eval_ppl_wikitext` does.
pub fn eval_windows(
    tokens: &[u32],
    seqlen: usize,
    limit: Option<usize>,
) -> Result<Vec<Vec<u32>>, DataError> {
    let n = tokens.len() / seqlen;
    if n == 0 {
        return Err(DataError::TooShort {
            what: "the evaluation text".into(),
            tokens: tokens.len(),
            needed: format!("one window of seqlen {seqlen} needs {seqlen}"),
        });
    }
    let n = limit.map_or(n, |l| l.min(n));
    Ok(tokens
        .chunks_exact(seqlen)
        .take(n)
        .map(<[u32]>::to_vec)
        .collect())
}

/// `nsamples` windows with seeded random starts in one tokenised text
/// (`random.seed(seed)`, then `randint(0, len - seqlen - 1)` per window).
pub fn calibration_windows(
    tokens: &[u32],
    nsamples: usize,
    seqlen: usize,
    seed: u64,
) -> Result<Vec<Vec<u32>>, DataError> {
    if tokens.len() <= seqlen {
        return Err(DataError::TooShort {
            what: "the calibration text".into(),
            tokens: tokens.len(),
            needed: format!("a window of seqlen {seqlen} needs at least {}", seqlen + 1),
        });
    }
    let mut rng = PyRandom::new(seed);
    let last = (tokens.len() - seqlen - 1) as u64;
    Ok((0..nsamples)
        .map(|_| {
            let i = rng.randint(0, last) as usize;
            tokens[i..i + seqlen].to_vec()
        })
        .collect())
}

/// Windows from a document corpus, as `get_c4` draws them: a random document
/// until one has more than `seqlen` tokens, then a random start inside it.
pub fn calibration_from_documents(
    docs: &[String],
    encode: &dyn Fn(&str) -> Result<Vec<u32>, String>,
    nsamples: usize,
    seqlen: usize,
    seed: u64,
) -> Result<Vec<Vec<u32>>, DataError> {
    if docs.is_empty() {
        return Err(DataError::Invalid(
            "the calibration corpus has no documents".into(),
        ));
    }
    let mut rng = PyRandom::new(seed);
    let mut out = Vec::with_capacity(nsamples);
    let max_draws = 1000 + 100 * nsamples;
    let mut draws = 0;
    while out.len() < nsamples {
        let enc = loop {
            draws += 1;
            if draws > max_draws {
                return Err(DataError::TooShort {
                    what: "the calibration corpus".into(),
                    tokens: 0,
                    needed: format!("no document longer than {seqlen} tokens in {max_draws} draws"),
                });
            }
            let d = rng.randint(0, docs.len() as u64 - 1) as usize;
            let enc = encode(&docs[d]).map_err(DataError::Invalid)?;
            if enc.len() > seqlen {
                break enc;
            }
        };
        let i = rng.randint(0, (enc.len() - seqlen - 1) as u64) as usize;
        out.push(enc[i..i + seqlen].to_vec());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eval_windows_stride_and_limit() {
        let t: Vec<u32> = (0..10).collect();
        let w = eval_windows(&t, 3, None).unwrap();
        assert_eq!(w, vec![vec![0, 1, 2], vec![3, 4, 5], vec![6, 7, 8]]);
        assert_eq!(eval_windows(&t, 3, Some(2)).unwrap().len(), 2);
        let e = eval_windows(&t, 11, None).unwrap_err();
        assert!(e.to_string().contains("10 tokens"), "{e}");
    }

    #[test]
    fn calibration_starts_match_python() {
        // random.seed(0); [random.randint(0, 288931 - 512 - 1) for _ in range(5)]
        let t: Vec<u32> = (0..288_931).collect();
        let w = calibration_windows(&t, 5, 512, 0).unwrap();
        let starts: Vec<u32> = w.iter().map(|x| x[0]).collect();
        assert_eq!(starts, [201979, 220500, 21225, 135746, 268055]);
        assert!(w.iter().all(|x| x.len() == 512));
        assert!(calibration_windows(&t[..512], 1, 512, 0).is_err());
    }

    #[test]
    fn seqlen_is_capped_with_a_warning() {
        assert_eq!(resolve_seqlen(None, 131_072).unwrap(), (2048, None));
        let (s, w) = resolve_seqlen(Some(4096), 2048).unwrap();
        assert_eq!(s, 2048);
        assert!(w.unwrap().contains("max_position_embeddings"));
        assert!(resolve_seqlen(Some(0), 2048).is_err());
    }

    #[test]
    fn documents_skip_short_ones() {
        let docs = vec!["a b".to_string(), "x ".repeat(50)];
        let enc = |s: &str| {
            Ok(s.split_whitespace()
                .map(|w| w.len() as u32)
                .collect::<Vec<_>>())
        };
        let w = calibration_from_documents(&docs, &enc, 3, 8, 0).unwrap();
        assert_eq!(w.len(), 3);
        assert!(w.iter().all(|x| x.len() == 8));
        let short = vec!["a".to_string()];
        assert!(calibration_from_documents(&short, &enc, 1, 8, 0).is_err());
    }
}
