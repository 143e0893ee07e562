//! One lab at a time, and `down` after the lab crashed: a process standing
//! in for the lab (it holds the lock, as a lab does, from another process)
//! with a namespace of the lab's prefix and a directory, then SIGKILLed;
//! `down` finds and removes what it left, and a second `down` finds
//! nothing; a state file naming directories the lab does not make has them
//! left alone and reported.

// Real processes in real time.
#![allow(clippy::disallowed_methods)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use std::path::PathBuf;

use lab::state::{
    LabLock, LabState, NETNS_PREFIX, NotLabMade, Process, StateError, down, read_state,
};

fn lab_netns() -> Vec<String> {
    std::fs::read_dir("/run/netns")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&format!("{NETNS_PREFIX}-")))
                .collect()
        })
        .unwrap_or_default()
}

/// A directory as `up` makes its own: `koi-lab-XXXXXX` in the temporary
/// directory, kept (the test or `down` removes it).
fn lab_dir() -> PathBuf {
    tempfile::Builder::new()
        .prefix("koi-lab-")
        .tempdir()
        .unwrap()
        .keep()
}

#[test]
fn a_second_lab_is_refused_and_down_removes_a_crashed_labs_leftovers() {
    let run = tempfile::tempdir().unwrap();
    // Named and placed as `up` makes its directory.
    let made = lab_dir();
    std::fs::create_dir_all(made.join("etc")).unwrap();

    // The "lab": one process holding the lock (flock(1) on an inherited
    // descriptor) and a namespace named as testbed names them,
    // `<prefix>-<pid>-<n>`.
    let lock = run.path().join("lock");
    let script = format!(
        "exec 9>'{}' && flock -n 9 && ip netns add koi-lab-$$-0 && echo up && exec sleep 600",
        lock.display()
    );
    let mut lab = Command::new("sh")
        .args(["-c", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(lab.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "up");
    let pid = lab.id();
    let state = LabState {
        process: Process::of(pid).unwrap(),
        started: 1_800_000_000,
        kernel: "host".into(),
        guest: None,
        dirs: vec![made.clone()],
    };
    std::fs::write(run.path().join("state.json"), state.encode().unwrap()).unwrap();
    assert!(lab_netns().contains(&format!("{NETNS_PREFIX}-{pid}-0")));

    // A second lab is refused, naming the running one.
    let mine = LabState {
        process: Process::current().unwrap(),
        ..state.clone()
    };
    let e = LabLock::acquire(run.path(), &mine).unwrap_err();
    assert!(matches!(e, StateError::AlreadyRunning(Some(ref s)) if s.process.pid == pid));
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("PID {pid}")) && msg.contains("kube-ovn-ipsec-lab down"),
        "{msg}"
    );
    assert_eq!(read_state(run.path()).unwrap(), Some(state.clone()));

    // The lab crashes (SIGKILL: no cleanup of its own); down removes what
    // it left.
    lab.kill().unwrap();
    lab.wait().unwrap();
    let t = Instant::now();
    let report = down(run.path()).unwrap();
    println!("down in {:?}: {report:?}", t.elapsed());
    assert!(report.stopped.is_empty(), "the lab was already dead");
    assert_eq!(report.dirs, std::slice::from_ref(&made));
    assert!(!made.exists());
    assert!(
        !lab_netns().contains(&format!("{NETNS_PREFIX}-{pid}-0")),
        "{:?}",
        lab_netns()
    );
    assert_eq!(read_state(run.path()).unwrap(), None);
    // Nothing left to do, and a new lab may start.
    assert_eq!(down(run.path()).unwrap(), Default::default());
    let held = LabLock::acquire(run.path(), &mine).unwrap();
    assert_eq!(read_state(run.path()).unwrap(), Some(mine));
    drop(held);
}

#[test]
fn down_stops_a_running_lab() {
    let run = tempfile::tempdir().unwrap();
    let mut lab = Command::new("sleep").arg("600").spawn().unwrap();
    let running = Process::of(lab.id()).unwrap();
    // A recorded process whose PID now names another one (its start time
    // differs) is never signalled.
    let reused = LabState {
        process: Process {
            start: running.start + 1,
            ..running
        },
        started: 1_800_000_000,
        kernel: "host".into(),
        guest: None,
        dirs: vec![],
    };
    std::fs::write(run.path().join("state.json"), reused.encode().unwrap()).unwrap();
    assert!(down(run.path()).unwrap().stopped.is_empty());
    assert!(
        lab.try_wait().unwrap().is_none(),
        "a reused PID was signalled"
    );
    let state = LabState {
        process: running,
        ..reused
    };
    std::fs::write(run.path().join("state.json"), state.encode().unwrap()).unwrap();
    let report = down(run.path()).unwrap();
    assert_eq!(report.stopped, [lab.id()]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while lab.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "still running after down");
        std::thread::sleep(Duration::from_millis(20));
    }
    // An unusable state file: said, and the prefix is still cleaned.
    std::fs::write(run.path().join("state.json"), "{garbage").unwrap();
    let report = down(run.path()).unwrap();
    assert!(report.unusable_state.is_some(), "{report:?}");
    assert_eq!(read_state(run.path()).unwrap(), None);
}

#[test]
fn down_removes_only_what_the_lab_made_and_names_what_it_left() {
    let run = tempfile::tempdir().unwrap();
    let temp = std::env::temp_dir();
    let made = lab_dir();
    std::fs::create_dir_all(made.join("node-0")).unwrap();
    // Someone else's directory, in the same temporary directory.
    let foreign = tempfile::Builder::new()
        .prefix("something-foreign-")
        .tempdir()
        .unwrap();
    let precious = foreign.path().join("precious");
    std::fs::write(&precious, "keep me").unwrap();
    let foreign_name = foreign.path().file_name().unwrap();
    // A lab-named link to it, and a lab-named path climbing out to it.
    let link = temp.join(format!("koi-lab-link-{}", std::process::id()));
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(foreign.path(), &link).unwrap();
    let escaping = made.join("..").join(foreign_name);
    // Listed first: a `down` that vets nothing fails on this file (not a
    // directory) before it reaches `/`.
    let tripwire = temp.join(format!("koi-lab-file-{}", std::process::id()));
    std::fs::write(&tripwire, "x").unwrap();
    let state = LabState {
        // This process: `down` never signals its caller.
        process: Process::current().unwrap(),
        started: 1_800_000_000,
        kernel: "host".into(),
        guest: None,
        dirs: vec![
            tripwire.clone(),
            foreign.path().to_path_buf(),
            PathBuf::from("/"),
            escaping.clone(),
            link.clone(),
            made.clone(),
        ],
    };
    std::fs::write(run.path().join("state.json"), state.encode().unwrap()).unwrap();

    let report = down(run.path()).unwrap();
    println!("{report:?}");
    assert_eq!(report.dirs, std::slice::from_ref(&made));
    assert!(!made.exists());
    let skipped: Vec<(PathBuf, NotLabMade)> = report
        .skipped
        .iter()
        .map(|s| (s.path.clone(), s.why.clone()))
        .collect();
    let not_lab = NotLabMade::NotLabName {
        temp_dir: temp.clone(),
    };
    assert_eq!(
        skipped,
        [
            (tripwire.clone(), NotLabMade::NotADirectory),
            (foreign.path().to_path_buf(), not_lab.clone()),
            (PathBuf::from("/"), not_lab),
            (escaping, NotLabMade::ParentComponent),
            (link.clone(), NotLabMade::Symlink),
        ]
    );
    for s in &report.skipped {
        assert!(!s.why.to_string().is_empty());
    }
    assert_eq!(std::fs::read_to_string(&precious).unwrap(), "keep me");
    assert!(link.is_symlink(), "the link itself is left too");
    assert!(tripwire.is_file());
    assert_eq!(read_state(run.path()).unwrap(), None);
    std::fs::remove_file(&link).unwrap();
    std::fs::remove_file(&tripwire).unwrap();
}
