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
