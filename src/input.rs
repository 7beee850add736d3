//! One rule for every file a user hands prunemem — texts, configs,
//! tokenizers, checkpoints, GGUF files, logs: it must be a regular file (a
//! FIFO with no writer would block forever, `/dev/zero` would be read until
//! memory runs out), its size is checked against a bound before a byte is
//! read, and a refusal names what the path is (a FIFO, a device, a folder, a
//! link loop) instead of "no such file". Texts may also be `-`, standard
//! input, read under the same bound.

use std::io::Read;
use std::path::Path;

/// The largest text (`--text`, `--calib-text`, `--eval-text`) read whole:
/// wikitext-103's training split is 540 MB; a text past this bound is a
/// mistake or an allocation the machine may not survive (tokenising takes
/// several times the text's size).
pub const TEXT_LIMIT: u64 = 2 << 30;
/// The largest JSON file read whole (config.json, tokenizer_config.json,
/// safetensors indexes, the save marker): the biggest real ones are a few MB.
pub const JSON_LIMIT: u64 = 64 << 20;
/// The largest tokenizer.json (real ones: 2-20 MB; Gemma's is 34 MB).
pub const TOKENIZER_LIMIT: u64 = 512 << 20;
/// The largest event log read whole by `report` and `replay`.
pub const LOG_LIMIT: u64 = 4 << 30;

thread_local! {
    /// Set while [`caught`] runs a parser that may panic on bad input.
    static CATCHING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs a third-party parser that panics on some malformed files (the
/// tokenizers crate `expect`s inside its decoder's deserializer), turning
/// a panic into an error message. The binary's panic hook stays quiet
/// while [`catching`] is true, so the user sees one error line.
pub fn caught<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    CATCHING.with(|c| c.set(true));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    CATCHING.with(|c| c.set(false));
    result.map_err(|p| {
        p.downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "the parser failed".into())
    })
}

/// Whether this thread is inside [`caught`].
pub fn catching() -> bool {
    CATCHING.with(|c| c.get())
}

/// Why a path was refused.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("{path}: {what}, not a regular file")]
    NotRegular { path: String, what: &'static str },
    #[error("{path}: no such file")]
    Missing { path: String },
    #[error("{path}: a symbolic link loop")]
    LinkLoop { path: String },
    #[error("{path}: {size} bytes, more than the {limit} bytes read for {role}")]
    TooLarge {
        path: String,
        size: u64,
        limit: u64,
        role: &'static str,
    },
    #[error("{path}: {message}")]
    Io { path: String, message: String },
}

/// `path` for a message: control characters (escapes, newlines) escaped, so
/// a file name cannot move the cursor, set the terminal's title or forge a
/// line of output.
pub fn shown(path: &Path) -> String {
    escape(&path.to_string_lossy())
}

/// `text` with control characters written as `\n`, `\t` or `\xNN`, for
/// anything from input that reaches a terminal or a one-line message.
pub fn escape(text: &str) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

fn io(path: &Path, e: &std::io::Error) -> InputError {
    if e.kind() == std::io::ErrorKind::NotFound {
        return InputError::Missing { path: shown(path) };
    }
    if e.raw_os_error() == Some(libc::ELOOP) {
        return InputError::LinkLoop { path: shown(path) };
    }
    InputError::Io {
        path: shown(path),
        message: e.to_string(),
    }
}

/// What a non-regular file is, in words.
fn kind(meta: &std::fs::Metadata) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    Some(if t.is_file() {
        return None;
    } else if t.is_dir() {
        "a folder"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a file"
    })
}

/// Checks `path` (following links) is a regular file; returns its size.
/// Never opens it, so a FIFO cannot block here.
pub fn check(path: &Path) -> Result<u64, InputError> {
    let meta = std::fs::metadata(path).map_err(|e| io(path, &e))?;
    match kind(&meta) {
        Some(what) => Err(InputError::NotRegular {
            path: shown(path),
            what,
        }),
        None => Ok(meta.len()),
    }
}

/// Checks `path` and its size against `limit`, then opens it.
pub fn open(path: &Path, limit: u64, role: &'static str) -> Result<std::fs::File, InputError> {
    let size = check(path)?;
    if size > limit {
        return Err(InputError::TooLarge {
            path: shown(path),
            size,
            limit,
            role,
        });
    }
    std::fs::File::open(path).map_err(|e| io(path, &e))
}

/// Reads a regular file of at most `limit` bytes (the bound holds even if
/// the file grows while it is read).
pub fn read(path: &Path, limit: u64, role: &'static str) -> Result<Vec<u8>, InputError> {
    if path.as_os_str() == "-" {
        return read_bounded(std::io::stdin().lock(), path, limit, role, 0);
    }
    let size = check(path)?;
    let file = open(path, limit, role)?;
    read_bounded(file, path, limit, role, size)
}

/// Reads at most `limit` bytes of `r`; `size` is the expected length (the
/// buffer is sized to it, as `std::fs::read` does: a doubling buffer would
/// hold up to twice the text for the whole run).
fn read_bounded(
    r: impl Read,
    path: &Path,
    limit: u64,
    role: &'static str,
    size: u64,
) -> Result<Vec<u8>, InputError> {
    let mut bytes = Vec::with_capacity(size.min(limit) as usize);
    r.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| io(path, &e))?;
    if bytes.len() as u64 > limit {
        return Err(InputError::TooLarge {
            path: shown(path),
            size: bytes.len() as u64,
            limit,
            role,
        });
    }
    Ok(bytes)
}

/// Reads a regular file of at most `limit` bytes as UTF-8 (a leading byte
/// order mark is dropped, as editors on Windows write one).
pub fn read_string(path: &Path, limit: u64, role: &'static str) -> Result<String, InputError> {
    let mut bytes = read(path, limit, role)?;
    if bytes.starts_with(b"\xEF\xBB\xBF") {
        bytes.drain(..3);
    }
    String::from_utf8(bytes).map_err(|e| InputError::Io {
        path: shown(path),
        message: format!(
            "not UTF-8 text (first invalid byte at offset {})",
            e.utf8_error().valid_up_to()
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("prunemem-input-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn every_kind_of_path_is_named() {
        let d = tmp("kinds");
        let fifo = d.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let loop_a = d.join("a");
        std::os::unix::fs::symlink(d.join("b"), &loop_a).unwrap();
        std::os::unix::fs::symlink(&loop_a, d.join("b")).unwrap();
        let cases: [(&Path, &str); 5] = [
            (&fifo, "a FIFO (named pipe), not a regular file"),
            (&d, "a folder, not a regular file"),
            (
                Path::new("/dev/zero"),
                "a character device, not a regular file",
            ),
            (&loop_a, "a symbolic link loop"),
            (&d.join("none"), "no such file"),
        ];
        for (path, want) in cases {
            let e = read(path, 10, "a test").unwrap_err().to_string();
            assert!(e.ends_with(want), "{e}");
        }
    }

    #[test]
    fn the_bound_is_checked_before_reading_and_a_bom_is_dropped() {
        let d = tmp("bound");
        let f = d.join("t.txt");
        std::fs::write(&f, b"\xEF\xBB\xBFhello").unwrap();
        assert_eq!(read_string(&f, 100, "a test").unwrap(), "hello");
        let e = read(&f, 4, "a test").unwrap_err().to_string();
        assert!(
            e.contains("8 bytes, more than the 4 bytes read for a test"),
            "{e}"
        );
    }

    #[test]
    fn control_characters_in_names_are_escaped() {
        let p = Path::new("a\x1b]0;owned\x07\nerror: b");
        assert_eq!(shown(p), "a\\x1b]0;owned\\x07\\nerror: b");
    }
}
