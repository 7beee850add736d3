//! Text in, token windows out: reading text and JSONL files, selecting line
//! ranges (the benchmark protocol's halves of WikiText-2), and cutting
//! calibration and evaluation windows the way the Wanda and SparseGPT
//! scripts do.

pub mod pyrandom;
pub mod windows;

use std::path::Path;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum DataError {
    #[error("{path}: {message}")]
    Io { path: String, message: String },
    #[error("{path} is not UTF-8 text (first invalid byte at offset {offset})")]
    NotUtf8 { path: String, offset: usize },
    #[error("{path}: line {line} is not a JSON object with a \"text\" string")]
    BadJsonl { path: String, line: usize },
    #[error(
        "bad line range '{0}': expected first-half, second-half, all, or START:END (line numbers from 0, END exclusive)"
    )]
    BadRange(String),
    #[error("{what} has {tokens} tokens; {needed}")]
    TooShort {
        what: String,
        tokens: usize,
        needed: String,
    },
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Input(#[from] crate::input::InputError),
}

/// A text source: a plain file (one document) or JSONL (one document per
/// line, in a `"text"` field).
pub enum Corpus {
    Text(String),
    Documents(Vec<String>),
}

/// Which lines of a text file to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineRange {
    All,
    FirstHalf,
    SecondHalf,
    Span(usize, usize),
}

impl std::str::FromStr for LineRange {
    type Err = DataError;
    fn from_str(s: &str) -> Result<Self, DataError> {
        let bad = || DataError::BadRange(s.to_string());
        Ok(match s {
            "all" => LineRange::All,
            "first-half" => LineRange::FirstHalf,
            "second-half" => LineRange::SecondHalf,
            _ => {
                let (a, b) = s.split_once(':').ok_or_else(bad)?;
                let a: usize = if a.is_empty() {
                    0
                } else {
                    a.parse().map_err(|_| bad())?
                };
                let b: usize = if b.is_empty() {
                    usize::MAX
                } else {
                    b.parse().map_err(|_| bad())?
                };
                if b <= a {
                    return Err(bad());
                }
                LineRange::Span(a, b)
            }
        })
    }
}

impl std::fmt::Display for LineRange {
    /// The spelling [`LineRange::from_str`] reads back.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LineRange::All => f.write_str("all"),
            LineRange::FirstHalf => f.write_str("first-half"),
            LineRange::SecondHalf => f.write_str("second-half"),
            LineRange::Span(a, usize::MAX) => write!(f, "{a}:"),
            LineRange::Span(a, b) => write!(f, "{a}:{b}"),
        }
    }
}

/// Splits text into lines that keep their terminator (`\n`, so CRLF files
/// keep `\r\n`): concatenating the lines gives back the text byte for byte.
pub fn lines(text: &str) -> Vec<&str> {
    text.split_inclusive('\n').collect()
}

/// The selected lines of `text`, concatenated. Halves split at
/// `len / 2` lines (Python: `lines[:n // 2]`, `lines[n // 2:]`).
pub fn select_lines(text: &str, range: LineRange) -> String {
    let all = lines(text);
    let n = all.len();
    let (a, b) = match range {
        LineRange::All => return text.to_string(),
        LineRange::FirstHalf => (0, n / 2),
        LineRange::SecondHalf => (n / 2, n),
        LineRange::Span(a, b) => (a.min(n), b.min(n)),
    };
    all[a..b].concat()
}

/// Reads a text file, refusing bytes that are not UTF-8.
/// Only a regular file of at most [`crate::input::TEXT_LIMIT`] bytes, or
/// `-` for standard input (a leading byte order mark is dropped).
pub fn read_text(path: &Path) -> Result<String, DataError> {
    let bytes = crate::input::read(path, crate::input::TEXT_LIMIT, "a text")?;
    let mut bytes = bytes;
    if bytes.starts_with(b"\xEF\xBB\xBF") {
        bytes.drain(..3);
    }
    String::from_utf8(bytes).map_err(|e| DataError::NotUtf8 {
        path: crate::input::shown(path),
        offset: e.utf8_error().valid_up_to(),
    })
}

/// Reads a corpus: `.jsonl` files as documents, anything else as one text,
/// restricted to `range` lines (for JSONL: documents).
pub fn read_corpus(path: &Path, range: LineRange) -> Result<Corpus, DataError> {
    let text = read_text(path)?;
    let is_jsonl = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("jsonl"));
    if let LineRange::Span(a, b) = range {
        let n = lines(&text).len();
        if a >= n || a >= b {
            return Err(DataError::Invalid(format!(
                "{}: lines {a}:{b} select nothing (the text has {n} lines)",
                crate::input::shown(path)
            )));
        }
    }
    let text = select_lines(&text, range);
    if !is_jsonl {
        return Ok(Corpus::Text(text));
    }
    let mut docs = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(line).map_err(|_| DataError::BadJsonl {
            path: path.display().to_string(),
            line: i + 1,
        })?;
        let t = v
            .get("text")
            .and_then(|t| t.as_str())
            .ok_or_else(|| DataError::BadJsonl {
                path: path.display().to_string(),
                line: i + 1,
            })?;
        docs.push(t.to_string());
    }
    Ok(Corpus::Documents(docs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_keep_crlf_bytes() {
        let text = "a\r\nb\r\n\r\nc\r\nd";
        assert_eq!(lines(text).len(), 5);
        let first = select_lines(text, LineRange::FirstHalf);
        let second = select_lines(text, LineRange::SecondHalf);
        assert_eq!(first, "a\r\nb\r\n");
        assert_eq!(format!("{first}{second}"), text);
        assert_eq!(select_lines(text, "1:3".parse().unwrap()), "b\r\n\r\n");
        assert!("3:1".parse::<LineRange>().is_err());
        assert!("half".parse::<LineRange>().is_err());
    }

    #[test]
    fn non_utf8_is_refused_with_offset() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.txt");
        std::fs::write(&p, b"ok text \xff\xfe more").unwrap();
        let e = read_text(&p).unwrap_err();
        assert!(e.to_string().contains("offset 8"), "{e}");
    }

    #[test]
    fn jsonl_documents() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c4.jsonl");
        std::fs::write(
            &p,
            "{\"text\":\"one\"}\n\n{\"text\":\"two\",\"url\":\"x\"}\n",
        )
        .unwrap();
        match read_corpus(&p, LineRange::All).unwrap() {
            Corpus::Documents(d) => assert_eq!(d, ["one", "two"]),
            Corpus::Text(_) => panic!("jsonl is documents"),
        }
        std::fs::write(&p, "{\"body\":\"one\"}\n").unwrap();
        assert!(read_corpus(&p, LineRange::All).is_err());
    }
}
