//! The crossed table (issue 43): every numeric flag of every command against
//! {0, −1, 1e-300, 1e300, NaN, inf, 2^53+1, u64::MAX}, and every input path
//! flag against {a FIFO, a folder, `/dev/zero`, a link loop, a non-UTF-8
//! name, a missing file, an unreadable file}. Each case must end in bounded
//! time (a FIFO must never block, `/dev/zero` never be read to the end) and
//! bounded memory (8 GiB of address space), with a documented exit status
//! (0, 2 usage or input, 3 out of memory, 74 output), one `error:` line when
//! it fails, no panic, and nothing left behind. A run that is long by request
//! (`train --steps 2^53+1`) must stop cleanly on SIGTERM.
//!
//! `cargo test --test crossed -- --nocapture` prints every case's result.

mod support;

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use prunemem::model::synthetic::{SyntheticSpec, write_checkpoint};

const VALUES: [&str; 8] = [
    "0",
    "-1",
    "1e-300",
    "1e300",
    "NaN",
    "inf",
    "9007199254740993",
    "18446744073709551615",
];

/// A case's wall-clock bound, and the grace after SIGTERM.
const BOUND: Duration = Duration::from_secs(30);
const GRACE: Duration = Duration::from_secs(20);

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

impl Fixture {
    fn p(&self, rel: &str) -> OsString {
        self.root.join(rel).into_os_string()
    }
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    write_checkpoint(&root.join("model"), &SyntheticSpec::default()).unwrap();
    std::fs::write(root.join("text.txt"), support::sample_text(3000)).unwrap();
    let fifo = std::ffi::CString::new(root.join("fifo").into_os_string().into_vec()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    std::fs::create_dir(root.join("folder")).unwrap();
    std::os::unix::fs::symlink(root.join("loop-b"), root.join("loop-a")).unwrap();
    std::os::unix::fs::symlink(root.join("loop-a"), root.join("loop-b")).unwrap();
    let mut name = b"text-\xff\xfe".to_vec();
    name.extend_from_slice(b".txt");
    std::fs::write(
        root.join(OsString::from_vec(name)),
        support::sample_text(3000),
    )
    .unwrap();
    let locked = root.join("unreadable.txt");
    std::fs::write(&locked, support::sample_text(3000)).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
    // A finished run's log, for report and replay.
    let out = Command::new(env!("CARGO_BIN_EXE_prunemem"))
        .args(["snapshot", "--log-memory"])
        .arg(root.join("run"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    Fixture { _dir: dir, root }
}

/// The path kinds crossed with every input path flag.
fn paths(f: &Fixture) -> Vec<(&'static str, OsString)> {
    let mut non_utf8 = f.root.clone().into_os_string().into_vec();
    non_utf8.extend_from_slice(b"/text-\xff\xfe.txt");
    vec![
        ("FIFO", f.p("fifo")),
        ("folder", f.p("folder")),
        ("/dev/zero", "/dev/zero".into()),
        ("link loop", f.p("loop-a")),
        ("non-UTF-8 name", OsString::from_vec(non_utf8)),
        ("missing", f.p("missing.txt")),
        ("unreadable", f.p("unreadable.txt")),
    ]
}

/// A case: its name, its argv, and whether it may run on by request (then
/// it is stopped with SIGTERM and must end cleanly).
struct Case {
    name: String,
    argv: Vec<OsString>,
    long_by_request: bool,
}

fn os(args: &[&str]) -> Vec<OsString> {
    args.iter().map(OsString::from).collect()
}

/// Each command's base argv (a quick, valid run on the fixture) and the
/// numeric flags crossed with [`VALUES`], with any flag a value needs.
fn numeric(f: &Fixture) -> Vec<(Vec<OsString>, &'static str, &'static [&'static str])> {
    let mut prune = os(&["prune", "--model"]);
    prune.extend([f.p("model"), "--calib-text".into(), f.p("text.txt")]);
    prune.extend(os(&["--nsamples", "2", "--seqlen", "16", "--ui", "none"]));
    let mut eval = os(&["eval", "--model"]);
    eval.extend([f.p("model"), "--text".into(), f.p("text.txt")]);
    eval.extend(os(&["--seqlen", "16", "--windows", "2", "--ui", "none"]));
    let mut train = os(&["train", "--model"]);
    train.extend([f.p("model"), "--text".into(), f.p("text.txt")]);
    train.extend(os(&["--seqlen", "16", "--steps", "1", "--ui", "none"]));
    let estimate = os(&["estimate", "--params", "1e8", "--method", "wanda"]);
    let mut replay = os(&["replay"]);
    replay.extend([f.p("run"), "--ui".into(), "none".into()]);
    let none: &[&str] = &[];
    let prune_flags: [(&str, &[&str]); 25] = [
        ("--sparsity", none),
        ("--nsamples", none),
        ("--seqlen", none),
        ("--seed", none),
        ("--batch-size", none),
        ("--eval-windows", &["--eval-text", "EVAL"]),
        ("--percdamp", &["--method", "sparsegpt"]),
        ("--blocksize", &["--method", "sparsegpt"]),
        ("--ria-a", &["--method", "ria"]),
        ("--owl-lambda", &["--owl"]),
        ("--owl-m", &["--owl"]),
        ("--dsnot-max-cycles", &["--dsnot"]),
        ("--dsnot-threshold", &["--dsnot"]),
        ("--dsnot-pow-var", &["--dsnot"]),
        ("--dsnot-skip", &["--dsnot"]),
        ("--sample-hz", none),
        ("--budget", none),
        ("--device-memory", none),
        ("--reduction-factor", &["--method", "gradprobe"]),
        ("--gradient-threshold", &["--method", "gradprobe"]),
        ("--num-batches", &["--method", "gradprobe"]),
        ("--stride", &["--method", "gradprobe"]),
        (
            "--initial-sparsity",
            &["--method", "gradprobe", "--iterative"],
        ),
        ("--sparsity-step", &["--method", "gradprobe", "--iterative"]),
        (
            "--max-ppl-increase",
            &["--method", "gradprobe", "--iterative"],
        ),
    ];
    let mut out = Vec::new();
    for (flag, extra) in prune_flags {
        out.push((prune.clone(), flag, extra));
    }
    for flag in [
        "--seqlen",
        "--windows",
        "--batch-size",
        "--sample-hz",
        "--budget",
    ] {
        out.push((eval.clone(), flag, none));
    }
    for flag in [
        "--batch-size",
        "--grad-accum",
        "--seqlen",
        "--steps",
        "--epochs",
        "--lr",
        "--weight-decay",
        "--momentum",
        "--seed",
        "--sample-hz",
    ] {
        out.push((train.clone(), flag, none));
    }
    for flag in [
        "--params",
        "--nsamples",
        "--seqlen",
        "--batch-size",
        "--grad-accum",
        "--ranks",
        "--eval-windows",
        "--sparsity",
        "--num-batches",
        "--fit",
    ] {
        out.push((estimate.clone(), flag, none));
    }
    out.push((os(&["snapshot", "--count", "1"]), "--every", none));
    out.push((os(&["snapshot", "--every", "0.01"]), "--count", none));
    out.push((os(&["snapshot"]), "--gpu", none));
    out.push((replay, "--speed", none));
    out.push((
        os(&["watch", "--ui", "none", "--", "true"]),
        "--sample-hz",
        none,
    ));
    out
}

/// Runs that are long only because the value asked for it.
fn long_by_request(flag: &str, value: &str) -> bool {
    let huge = value.len() > 10;
    matches!(flag, "--steps" | "--epochs" | "--count") && huge
}

fn cases(f: &Fixture) -> Vec<Case> {
    let mut out = Vec::new();
    for (base, flag, extra) in numeric(f) {
        for value in VALUES {
            let mut argv = base.clone();
            // A flag already in the base (--seqlen) takes the value instead.
            if let Some(at) = argv.iter().position(|a| a == flag) {
                argv[at + 1] = value.into();
            } else {
                let at = argv.iter().position(|a| a == "--").unwrap_or(argv.len());
                argv.splice(at..at, [OsString::from(flag), value.into()]);
            }
            for e in extra {
                argv.push(if *e == "EVAL" {
                    f.p("text.txt")
                } else {
                    e.into()
                });
            }
            out.push(Case {
                name: format!("{} {flag} {value}", argv[0].to_string_lossy()),
                long_by_request: long_by_request(flag, value),
                argv,
            });
        }
    }
    // Each input path flag in a quick, valid command; PATH takes each kind.
    let (m, t) = ("MODEL", "TEXT");
    let quick = ["--nsamples", "2", "--seqlen", "16", "--ui", "none"];
    let eval = ["--seqlen", "16", "--windows", "2", "--ui", "none"];
    let path_flags: Vec<(&str, Vec<&str>)> = vec![
        (
            "prune --model",
            [&["prune", "--model", "PATH", "--calib-text", t][..], &quick].concat(),
        ),
        (
            "prune --calib-text",
            [&["prune", "--model", m, "--calib-text", "PATH"][..], &quick].concat(),
        ),
        (
            "prune --eval-text",
            [
                &[
                    "prune",
                    "--model",
                    m,
                    "--calib-text",
                    t,
                    "--eval-text",
                    "PATH",
                    "--eval-windows",
                    "2",
                ][..],
                &quick,
            ]
            .concat(),
        ),
        (
            "eval --model",
            [&["eval", "--model", "PATH", "--text", t][..], &eval].concat(),
        ),
        (
            "eval --text",
            [&["eval", "--model", m, "--text", "PATH"][..], &eval].concat(),
        ),
        (
            "train --text",
            vec![
                "train", "--model", m, "--text", "PATH", "--seqlen", "16", "--steps", "1", "--ui",
                "none",
            ],
        ),
        ("estimate --model", vec!["estimate", "--model", "PATH"]),
        ("estimate --against", vec!["estimate", "--against", "PATH"]),
        (
            "convert --gguf",
            vec!["convert", "--gguf", "PATH", "--out", "OUT"],
        ),
        ("report", vec!["report", "PATH", "--out", "OUT"]),
        ("replay", vec!["replay", "PATH", "--ui", "none"]),
        (
            "watch --log",
            vec!["watch", "--log", "PATH", "--ui", "none"],
        ),
        (
            "watch --follow",
            vec!["watch", "--follow", "PATH", "--ui", "none", "--", "true"],
        ),
    ];
    for (flag, template) in &path_flags {
        for (kind, path) in paths(f) {
            let argv = template
                .iter()
                .map(|a| match *a {
                    "PATH" => path.clone(),
                    "MODEL" => f.p("model"),
                    "TEXT" => f.p("text.txt"),
                    // An output a failed run must not leave behind.
                    "OUT" => f.p("out"),
                    other => other.into(),
                })
                .collect();
            out.push(Case {
                name: format!("{flag} {kind}"),
                argv,
                long_by_request: false,
            });
        }
    }
    out
}

/// What one case did.
struct Outcome {
    code: Option<i32>,
    stderr: String,
    seconds: f64,
    stopped: bool,
}

fn run(case: &Case, tmp: &Path) -> Outcome {
    let t = Instant::now();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_prunemem"));
    cmd.args(&case.argv)
        .env("TMPDIR", tmp)
        .env("HF_HUB_OFFLINE", "1")
        .env("PRUNEMEM_CACHE", tmp.join("cache"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 8 << 30,
                rlim_max: 8 << 30,
            };
            libc::setrlimit(libc::RLIMIT_AS, &limit);
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut std::io::BufReader::new(stderr), &mut s);
        s
    });
    let bound = if case.long_by_request {
        Duration::from_secs(5)
    } else {
        BOUND
    };
    let mut stopped = false;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if !stopped && t.elapsed() > bound {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            stopped = true;
        }
        if stopped && t.elapsed() > bound + GRACE {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    use std::os::unix::process::ExitStatusExt;
    Outcome {
        code: status.and_then(|s| s.code().or(s.signal().map(|k| 128 + k))),
        stderr: reader.join().unwrap(),
        seconds: t.elapsed().as_secs_f64(),
        stopped,
    }
}

/// Why `o` breaks the table's rules (empty: it keeps them).
fn judge(case: &Case, o: &Outcome) -> Vec<String> {
    let mut why = Vec::new();
    let lines: Vec<&str> = o.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    if o.stopped && !case.long_by_request {
        why.push(format!("still running after {} s", BOUND.as_secs()));
    }
    match o.code {
        None => why.push("did not stop on SIGTERM".into()),
        Some(0) => {}
        Some(2 | 3 | 74) => {
            if lines.len() != 1 || !lines[0].starts_with("error") {
                why.push(format!("stderr {lines:?}"));
            }
        }
        // Interrupted (130, logs flushed) or SIGTERM's own status, for a run stopped by request.
        Some(130 | 143) if o.stopped => {}
        Some(c) => why.push(format!("exit {c}")),
    }
    if o.stderr.contains("internal error") || o.stderr.contains("panicked") {
        why.push("panic".into());
    }
    if o.stderr.contains('\x1b') {
        why.push("a raw escape on stderr".into());
    }
    why
}

#[test]
fn every_flag_crossed_with_hostile_values_ends_clean() {
    let f = fixture();
    let all = cases(&f);
    assert!(all.len() >= 400, "the table has {} cases", all.len());
    let before = support::listing(&f.root);
    let tmp = tempfile::tempdir().unwrap();
    let (mut table, mut failures) = (Vec::new(), Vec::new());
    // Two at a time: CI has two cores.
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<(usize, Outcome)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let k = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        let Some(case) = all.get(k) else { break };
                        mine.push((k, run(case, tmp.path())));
                    }
                    mine
                })
            })
            .collect();
        let mut all: Vec<_> = workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect();
        all.sort_by_key(|(k, _)| *k);
        all
    });
    for (k, o) in &results {
        let case = &all[*k];
        let first = o
            .stderr
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        table.push(format!(
            "| {} | {:?} | {:.1} | {} |",
            case.name,
            o.code,
            o.seconds,
            first.chars().take(150).collect::<String>()
        ));
        let why = judge(case, o);
        if !why.is_empty() {
            failures.push(format!("{}: {}", case.name, why.join("; ")));
        }
    }
    let after = support::listing(&f.root);
    let left: Vec<_> = after.difference(&before).collect();
    let in_tmp: Vec<_> = support::listing(tmp.path())
        .into_iter()
        .filter(|p| !p.starts_with(tmp.path().join("cache")))
        .collect();
    println!(
        "| case | exit | seconds | first line of stderr |\n|---|---|---|---|\n{}",
        table.join("\n")
    );
    assert!(left.is_empty(), "left in the fixture: {left:?}");
    assert!(in_tmp.is_empty(), "left in TMPDIR: {in_tmp:?}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
