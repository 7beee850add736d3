//! The kernels a device run compiles, and the kernel cache that spares a
//! later run of the same build from compiling them again, as the run
//! itself reports them (`transfers`' `compiled` and `from_cache`).

use super::*;

/// Two runs of the same job from the command line, each a process of its
/// own, with an empty kernel cache: the first compiles every kernel it
/// launches and loads none; the second compiles none and loads them from
/// the cache; with the cache off, a run compiles again. The plan names
/// the cache, and the summary says what the run compiled.
#[test]
fn a_second_run_loads_the_kernels_the_first_compiled() {
    let (dir, model, text) = cli_fixture();
    let cache = dir.path().join("kernels");
    let logs = dir.path().join("logs");
    let run = |cache: &str| -> serde_json::Value {
        let argv = wanda_on_wgpu(&model, &text, &["--json", "--log-memory", s(&logs)]);
        let (code, stdout, stderr) =
            support::run_prunemem_with(&argv, &[("PRUNEMEM_KERNEL_CACHE", cache)]);
        assert_eq!(code, Some(0), "{stderr}");
        stdout
            .lines()
            .rev()
            .find_map(|l| serde_json::from_str(l).ok())
            .unwrap_or_else(|| panic!("no --json line in {stdout}"))
    };
    let total = |j: &serde_json::Value, k: &str| -> u64 {
        let t = j["transfers"].as_object().unwrap();
        t.values()
            .map(|p| {
                p[k].as_u64()
                    .unwrap_or_else(|| panic!("{k} not counted: {p}"))
            })
            .sum()
    };
    let first = run(s(&cache));
    let second = run(s(&cache));
    let summary = std::fs::read_to_string(logs.join("summary.txt")).unwrap();
    let plan = std::fs::read_to_string(logs.join("events.jsonl")).unwrap();
    let off = run("off");
    let counts = |j: &serde_json::Value| {
        (
            total(j, "compiled"),
            total(j, "from_cache"),
            total(j, "kernels"),
        )
    };
    println!(
        "compiled / from the cache / launches: first {:?}, second {:?}, cache off {:?}",
        counts(&first),
        counts(&second),
        counts(&off)
    );
    let (compiled, loaded, launches) = counts(&first);
    assert!(
        compiled > 0 && compiled < launches,
        "{}",
        first["transfers"]
    );
    assert_eq!(
        loaded, 0,
        "an empty cache has nothing to load: {}",
        first["transfers"]
    );
    let (compiled2, loaded2, _) = counts(&second);
    assert_eq!(
        compiled2, 0,
        "the second run compiled: {}",
        second["transfers"]
    );
    assert_eq!(loaded2, compiled, "{}", second["transfers"]);
    let (compiled_off, loaded_off, _) = counts(&off);
    assert_eq!(
        (compiled_off, loaded_off),
        (compiled, 0),
        "{}",
        off["transfers"]
    );
    assert!(
        summary.contains(&format!(
            "0 compiled, {compiled} loaded from the kernel cache"
        )),
        "{summary}"
    );
    // The cache is this build's own folder under the one named, and the
    // plan says which.
    let folders: Vec<_> = std::fs::read_dir(&cache).unwrap().flatten().collect();
    assert_eq!(folders.len(), 1, "{folders:?}");
    let folder = folders[0].path();
    assert!(
        plan.contains(&format!("\"kernel_cache\":\"{}\"", folder.display())),
        "{}",
        plan.lines().next().unwrap_or("")
    );
}

/// An older build's folder under `root`, marked as last used `age` seconds
/// ago, with one compiled kernel's worth of bytes.
fn older_build(root: &std::path::Path, name: &str, age: u64) -> std::path::PathBuf {
    use prunemem::exec::kernel_cache::{MARKER, mark};
    let dir = root.join(name);
    std::fs::create_dir_all(dir.join("vulkan")).unwrap();
    std::fs::write(dir.join("vulkan").join("kernel.spv"), vec![0u8; 4096]).unwrap();
    mark(&dir).unwrap();
    let when = std::time::SystemTime::now() - std::time::Duration::from_secs(age);
    let marker = std::fs::File::options().write(true).open(dir.join(MARKER));
    marker.unwrap().set_modified(when).unwrap();
    dir
}

/// A device run marks its build's folder as used and removes the least
/// recently used of the other builds' folders past
/// `PRUNEMEM_KERNEL_CACHE_KEEP`; a folder without the marker (a user's,
/// an older build's) stays, and the plan and the summary say what went.
/// A value that is not a count is a warning, and nothing is removed.
#[test]
fn a_run_removes_the_least_recently_used_builds_kernels() {
    let (dir, model, text) = cli_fixture();
    let cache = dir.path().join("kernels");
    let logs = dir.path().join("logs");
    let old = older_build(&cache, "0.0.1-00000000000000aa", 3_000);
    let older = older_build(&cache, "0.0.1-00000000000000bb", 9_000);
    let recent = older_build(&cache, "0.0.1-00000000000000cc", 60);
    let mine = cache.join("my-notes");
    std::fs::create_dir_all(&mine).unwrap();
    std::fs::write(mine.join("keep.txt"), "not prunemem's").unwrap();
    let run = |keep: &str| -> (String, String) {
        let argv = wanda_on_wgpu(&model, &text, &["--log-memory", s(&logs)]);
        let env = [
            ("PRUNEMEM_KERNEL_CACHE", s(&cache)),
            ("PRUNEMEM_KERNEL_CACHE_KEEP", keep),
        ];
        let (code, _, stderr) = support::run_prunemem_with(&argv, &env);
        assert_eq!(code, Some(0), "{stderr}");
        (
            std::fs::read_to_string(logs.join("events.jsonl")).unwrap(),
            std::fs::read_to_string(logs.join("summary.txt")).unwrap(),
        )
    };
    let (events, summary) = run("2");
    // Kept: this build's and the most recently used other; the two older
    // ones went, the least recently used first.
    assert!(recent.exists() && mine.join("keep.txt").exists());
    assert!(!old.exists() && !older.exists());
    let plan: serde_json::Value = serde_json::from_str(events.lines().next().unwrap()).unwrap();
    let removed = &plan["plan"]["settings"]["kernel_cache_removed"];
    let names: Vec<&str> = removed
        .as_array()
        .unwrap_or_else(|| panic!("no kernel_cache_removed in {plan}"))
        .iter()
        .map(|r| r["build"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["0.0.1-00000000000000bb", "0.0.1-00000000000000aa"]);
    assert!(
        removed
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["bytes"].as_u64() > Some(4096))
    );
    assert!(
        summary.contains("removed 2 older builds' kernel folders"),
        "{summary}"
    );
    // This run's folder carries the marker now.
    let this = plan["plan"]["settings"]["kernel_cache"].as_str().unwrap();
    assert!(
        std::path::Path::new(this)
            .join(prunemem::exec::kernel_cache::MARKER)
            .is_file()
    );

    let (events, _) = run("none");
    assert!(recent.exists());
    assert!(
        events.contains("PRUNEMEM_KERNEL_CACHE_KEEP=\\\"none\\\""),
        "no warning in {}",
        events.lines().take(3).collect::<Vec<_>>().join("\n")
    );
    assert!(
        !events
            .lines()
            .next()
            .unwrap()
            .contains("kernel_cache_removed")
    );
}

/// A `cubecl.toml` in the working directory that names cubecl's cache is
/// the user's setting: the run's kernels go there, the plan says so, and
/// prunemem's own root is neither marked nor tidied.
#[test]
fn a_cubecl_toml_cache_is_left_to_cubecl() {
    let (dir, model, text) = cli_fixture();
    let ours = dir.path().join("prunemem-kernels");
    let old = older_build(&ours, "0.0.1-00000000000000aa", 3_000);
    let theirs = dir.path().join("cubecl-cache");
    let cwd = dir.path().join("project");
    std::fs::create_dir_all(&cwd).unwrap();
    let toml = format!("[compilation]\ncache = {{ file = {:?} }}\n", s(&theirs));
    std::fs::write(cwd.join("cubecl.toml"), toml).unwrap();
    let logs = dir.path().join("logs");
    let argv = wanda_on_wgpu(&model, &text, &["--log-memory", s(&logs)]);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_prunemem"))
        .args(&argv)
        .current_dir(&cwd)
        .env("PRUNEMEM_KERNEL_CACHE", &ours)
        .env("PRUNEMEM_KERNEL_CACHE_KEEP", "1")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = std::fs::read_to_string(logs.join("events.jsonl")).unwrap();
    let plan: serde_json::Value = serde_json::from_str(events.lines().next().unwrap()).unwrap();
    let setting = plan["plan"]["settings"]["kernel_cache"].as_str().unwrap();
    assert!(setting.starts_with(s(&theirs)), "{setting}");
    assert!(
        plan["plan"]["settings"]
            .get("kernel_cache_removed")
            .is_none()
    );
    // cubecl kept the kernels where the toml said; prunemem's root is as
    // it was: the older build still there, no folder of this build's.
    assert!(
        theirs.exists(),
        "cubecl wrote nothing to {}",
        theirs.display()
    );
    assert!(old.exists());
    let folders = std::fs::read_dir(&ours).unwrap().count();
    assert_eq!(folders, 1, "prunemem's root was written to");
}
