//! The device evaluation through the CLI: estimated from its buffers, an
//! untied head (whole, in shards, with a named matmul strategy), and a
//! table past the device's largest buffer.

use super::*;

/// `prunemem eval` of two 32-token windows of `text` with `args`, the
/// device's largest buffer lowered to `max_buffer` when given, and `env`
/// set.
fn eval_windows(
    model: &Path,
    text: &Path,
    args: &[&str],
    max_buffer: Option<&str>,
    env: &[(&str, &str)],
) -> (Option<i32>, String, String) {
    let mut argv = vec!["eval", "--model", s(model), "--text", s(text)];
    argv.extend(["--windows", "2", "--seqlen", "32", "--ui", "none", "--json"]);
    argv.extend_from_slice(args);
    let mut env = env.to_vec();
    env.extend(max_buffer.map(|m| ("PRUNEMEM_MAX_BUFFER", m)));
    support::run_prunemem_with(&argv, &env)
}

/// `prunemem eval --device wgpu` is estimated as the device engine's own
/// evaluation (inference on wgpu had been refused by the estimator): every
/// measured phase within 5%, the weights to the byte.
#[test]
fn a_device_eval_is_estimated_from_its_buffers() {
    let (dir, model, text) = cli_fixture();
    let logs = dir.path().join("eval-logs");
    let (code, stdout, stderr) = eval_windows(
        &model,
        &text,
        &["--device", "wgpu", "--log-memory", s(&logs)],
        None,
        &[],
    );
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let (code, stdout, stderr) = run_prunemem(&["estimate", "--against", s(&logs), "--json"]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let cmp: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let phases: Vec<_> = cmp["phases"].as_array().unwrap().iter().collect();
    assert_eq!(phases.len(), 2, "load and eval: {stdout}");
    let eval = phases[1];
    let measured = eval["measured"].as_u64().expect("the eval phase measured");
    let error = eval["error_percent"].as_f64().unwrap();
    println!(
        "eval: predicted {}, measured {measured} ({error:+.2}%)",
        eval["predicted"]
    );
    assert!(measured > 0 && error.abs() <= 5.0, "{eval}");
    for c in eval["categories"].as_array().into_iter().flatten() {
        println!(
            "  {}: predicted {} measured {}",
            c["category"], c["predicted"], c["measured"]
        );
        if c["category"] == "weights" {
            assert_eq!(c["predicted"], c["measured"], "{eval}");
        }
    }
}

/// The perplexity of a run that must have succeeded.
fn perplexity_of((code, stdout, stderr): (Option<i32>, String, String)) -> f64 {
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    support::json_line(&stdout)["perplexity"].as_f64().unwrap()
}

/// An untied head goes up in shards like the embedding: the same bits as
/// one table (f16, `PRUNEMEM_MAX_BUFFER=256KiB`: four shards). And with
/// `PRUNEMEM_HEAD_MATMUL` naming cubek's unit kernel, the head's product
/// reads the table in its stored layout, whole or in shards, every launch
/// taken (none handed back to Burn's matmul), to the perplexity Burn's
/// matmul gives.
fn untied_head_in_shards() {
    let spec = prunemem::model::synthetic::SyntheticSpec {
        tied: false,
        vocab: 4096,
        ..Default::default()
    };
    let (_dir, model, text) = fixture_of(&spec, 2000);
    let run = |max_buffer, env: &[(&str, &str)]| {
        eval_windows(&model, &text, &["--device", "wgpu"], max_buffer, env)
    };
    let eval = |max_buffer| perplexity_of(run(max_buffer, &[]));
    let (whole, sharded) = (eval(None), eval(Some("256KiB")));
    println!("untied head: perplexity whole {whole}, in shards {sharded}");
    assert_eq!(whole.to_bits(), sharded.to_bits(), "{whole} vs {sharded}");
    let unit = [("PRUNEMEM_HEAD_MATMUL", "simple_unit")];
    for (max_buffer, burns) in [(None, whole), (Some("256KiB"), sharded)] {
        let out = run(max_buffer, &unit);
        let json = support::json_line(&out.1);
        let named = perplexity_of(out);
        println!("untied head, unit kernel ({max_buffer:?}): perplexity {named}");
        assert!((named / burns - 1.0).abs() < 1e-6, "{named} vs {burns}");
        let matmul = &json["device_kernels"]["matmul"];
        assert!(matmul["ran"].as_u64() > Some(0), "{json}");
        assert_eq!(matmul["fell_back"], 0, "{json}");
    }
}

/// A table past the device's largest buffer (lavapipe: 128 MiB; a 49 152 ×
/// 768 f32 embedding is 144 MiB) used to be refused inside cubecl's server
/// thread, which left the embedding empty and the run going to a garbage
/// perplexity with exit 0, then failed the run in one line. Streamed, it now
/// goes up in shards (`model::vocab`); a resident model, which keeps Burn's
/// one-tensor table, still fails in one line (exit 2) and its log says so.
#[test]
fn a_table_past_the_devices_largest_buffer_is_sharded_and_a_resident_model_refused() {
    // SmolLM2's vocabulary at 768 wide: 144 MiB in f32, past lavapipe's
    // 128 MiB buffers; 72 MiB in f16.
    let spec = prunemem::model::synthetic::SyntheticSpec {
        hidden: 768,
        intermediate: 256,
        layers: 1,
        heads: 12,
        kv_heads: 4,
        vocab: 49152,
        dtype: safetensors::Dtype::F16,
        ..Default::default()
    };
    let (dir, model, text) = fixture_of(&spec, 2000);
    let logs = dir.path().join("logs");
    let eval = |device: &str, dtype: &str, extra: &[&str], max_buffer: Option<&str>| {
        let mut args = vec!["--device", device, "--dtype", dtype];
        args.extend_from_slice(extra);
        eval_windows(&model, &text, &args, max_buffer, &[])
    };
    let ppl = perplexity_of;
    // Streamed, the f32 table goes up in shards: the CPU backend's figure.
    let cpu = ppl(eval("cpu", "f32", &[], None));
    let sharded = ppl(eval("wgpu", "f32", &[], None));
    println!("f32 perplexity: cpu {cpu}, wgpu (table in shards) {sharded}");
    assert!((sharded / cpu - 1.0).abs() < 1e-4, "{sharded} vs {cpu}");
    // In f16 the table fits one buffer; in shards of 16 MiB it gives the
    // same bits.
    let whole = ppl(eval("wgpu", "f16", &[], None));
    let small = ppl(eval("wgpu", "f16", &[], Some("16MiB")));
    assert_eq!(whole.to_bits(), small.to_bits(), "{whole} vs {small}");
    untied_head_in_shards();

    // A resident model keeps Burn's one-tensor table: refused in one line.
    let (code, stdout, stderr) = eval(
        "wgpu",
        "f32",
        &["--resident", "--log-memory", s(&logs)],
        None,
    );
    // The command line ran wgpu, whichever device the in-process tests use.
    let adapter = Exec::open(WGPU, None).unwrap().adapter().to_string();
    if !adapter.contains("llvmpipe") {
        // A real GPU's buffers are larger: the run must simply succeed.
        assert_eq!(code, Some(0), "{adapter}: {stdout}\n{stderr}");
        return;
    }
    assert_eq!(code, Some(2), "{stdout}\n{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    assert!(
        lines[0].contains("passes the device's largest buffer"),
        "{stderr}"
    );
    assert!(
        !stdout.contains("perplexity"),
        "no result from a failed device: {stdout}"
    );
    let Some(Event::RunFinished { summary }) = events(&logs).pop() else {
        panic!("the log ends with the run's summary")
    };
    assert!(
        matches!(summary.status, RunStatus::Failed(_)),
        "{:?}",
        summary.status
    );
}
