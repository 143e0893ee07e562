//! The quick-start demo against the real ovsdb-server and ovn-northd: it must
//! activate a generation without losing a foreign key and see both NB→SB
//! flips. A missing daemon fails the test with the program's name.

#[tokio::test]
async fn demo_runs_on_the_real_databases() {
    let dir = tempfile::tempdir().unwrap();
    if let Err(e) = lab::demo::run(dir.path()).await {
        panic!("lab demo failed: {e}");
    }
}
