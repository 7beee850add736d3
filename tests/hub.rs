//! Downloading a model by Hub id, from a Hub stand-in on 127.0.0.1.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use prunemem::model::synthetic::{SyntheticSpec, write_checkpoint};
use prunemem::model::{Checkpoint, hub};

/// Serves `root/<file>` at `/org/tiny/resolve/main/<file>`; counts requests.
fn serve(root: PathBuf) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(64) {
            let Ok(mut stream) = stream else { continue };
            counter.fetch_add(1, Ordering::SeqCst);
            let mut line = String::new();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            reader.read_line(&mut line).unwrap();
            loop {
                let mut h = String::new();
                if reader.read_line(&mut h).unwrap() == 0 || h == "\r\n" {
                    break;
                }
            }
            let path = line.split_whitespace().nth(1).unwrap_or("");
            let file = path.strip_prefix("/org/tiny/resolve/main/");
            match file.map(|f| std::fs::read(root.join(f))) {
                Some(Ok(body)) => {
                    write!(
                        stream,
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    )
                    .unwrap();
                    stream.write_all(&body).unwrap();
                }
                _ => {
                    write!(
                        stream,
                        "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    )
                    .unwrap();
                }
            }
        }
    });
    (addr, hits)
}

#[test]
fn downloads_a_sharded_model_once() {
    let tmp = tempfile::tempdir().unwrap();
    let remote = tmp.path().join("remote");
    write_checkpoint(
        &remote,
        &SyntheticSpec {
            shards: 2,
            ..Default::default()
        },
    )
    .unwrap();
    let (endpoint, hits) = serve(remote);
    // SAFETY: this test binary has a single test; nothing reads env concurrently.
    unsafe {
        std::env::set_var("HF_ENDPOINT", &endpoint);
        std::env::set_var("HF_HUB_CACHE", tmp.path().join("hf-cache"));
        std::env::set_var("PRUNEMEM_CACHE", tmp.path().join("cache"));
    }
    let dir = hub::resolve("org/tiny", "main").unwrap();
    assert!(dir.starts_with(tmp.path().join("cache")));
    let ckpt = Checkpoint::open(&dir).unwrap();
    assert!(ckpt.sharded);
    assert!(dir.join("tokenizer.json").is_file());
    let first = hits.load(Ordering::SeqCst);
    assert!(
        first >= 5,
        "config, tokenizer files, index and two shards: {first}"
    );
    assert_eq!(hub::resolve("org/tiny", "main").unwrap(), dir);
    assert_eq!(
        hits.load(Ordering::SeqCst),
        first,
        "the second resolve uses the cache"
    );
    let err = hub::resolve("org/missing", "main").unwrap_err();
    assert!(err.to_string().contains("no config.json"), "{err}");
    // A local path is used as is, never downloaded.
    assert_eq!(hub::resolve(dir.to_str().unwrap(), "main").unwrap(), dir);
}
