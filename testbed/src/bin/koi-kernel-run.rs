//! `koi-kernel-run [--timeout SECS] -- COMMAND [ARGS...]`: runs COMMAND on a
//! kernel with ESP, GENEVE and the OVS kernel datapath — the host's when it
//! has them, otherwise a Debian guest under qemu (`testbed::guest`) — and
//! exits with COMMAND's status. Prints which kernel it used and, for a
//! guest, the accelerator and the boot and total times.
//!
//! `koi-kernel-run --prepare` only makes sure that kernel is there: nothing
//! when the host's will do, otherwise the guest kernel fetched and unpacked
//! into its cache (what the setup scripts call, so the first test does not
//! pay for the download).

use std::process::ExitCode;
use std::time::Duration;

use testbed::guest::{GuestKernel, KernelChoice, run_in_guest};

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut timeout = Duration::from_secs(900);
    let mut command = Vec::new();
    let mut prepare_only = false;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--prepare" => prepare_only = true,
            "--timeout" => match args.next().and_then(|s| s.parse().ok()) {
                Some(secs) => timeout = Duration::from_secs(secs),
                None => {
                    eprintln!("koi-kernel-run: --timeout takes whole seconds");
                    return ExitCode::from(2);
                }
            },
            "--" => {
                command.extend(args.by_ref());
            }
            other => {
                eprintln!(
                    "koi-kernel-run: unexpected `{other}` (usage: koi-kernel-run [--timeout SECS] -- COMMAND [ARGS...] | koi-kernel-run --prepare)"
                );
                return ExitCode::from(2);
            }
        }
    }
    if prepare_only {
        return prepare();
    }
    if command.is_empty() {
        eprintln!(
            "koi-kernel-run: no command (usage: koi-kernel-run [--timeout SECS] -- COMMAND [ARGS...] | koi-kernel-run --prepare)"
        );
        return ExitCode::from(2);
    }
    let choice = match KernelChoice::decide() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("koi-kernel-run: {e}");
            return ExitCode::from(2);
        }
    };
    match choice {
        KernelChoice::Host => {
            eprintln!(
                "koi-kernel-run: the host kernel has ESP, GENEVE and openvswitch: running here"
            );
            match std::process::Command::new(&command[0])
                .args(&command[1..])
                .status()
            {
                Ok(s) => ExitCode::from(u8::try_from(s.code().unwrap_or(1)).unwrap_or(1)),
                Err(e) => {
                    eprintln!("koi-kernel-run: {}: {e}", command[0]);
                    ExitCode::from(2)
                }
            }
        }
        KernelChoice::Vm { kvm } => {
            let kernel = match GuestKernel::prepare(&GuestKernel::cache_dir()) {
                Ok(k) => k,
                Err(e) => {
                    eprintln!("koi-kernel-run: {e}");
                    return ExitCode::from(2);
                }
            };
            let cwd = std::env::current_dir().unwrap_or_else(|_| "/".into());
            // What the tests read from the environment, passed through.
            let env: Vec<(String, String)> = std::env::vars()
                .filter(|(k, _)| {
                    k.starts_with("RUST_")
                        || k.starts_with("KUBE_OVN_IPSEC_")
                        || k == "CARGO_MANIFEST_DIR"
                })
                .collect();
            eprintln!(
                "koi-kernel-run: the host kernel lacks ESP, GENEVE or openvswitch: booting Debian's {} under qemu ({})",
                kernel.release,
                if kvm { "kvm" } else { "tcg" }
            );
            match run_in_guest(
                &kernel,
                kvm,
                &cwd,
                &command,
                &env,
                timeout,
                &mut std::io::stdout(),
            ) {
                Ok(run) => {
                    eprintln!(
                        "koi-kernel-run: guest ({}) booted to the command in {:.1} s, whole run {:.1} s, exit {}",
                        run.accel,
                        run.boot.as_secs_f64(),
                        run.total.as_secs_f64(),
                        run.status
                    );
                    ExitCode::from(u8::try_from(run.status).unwrap_or(1))
                }
                Err(e) => {
                    eprintln!("koi-kernel-run: {e}");
                    ExitCode::from(2)
                }
            }
        }
    }
}

/// `--prepare`: the kernel the checks will use is there.
fn prepare() -> ExitCode {
    match KernelChoice::decide() {
        Ok(KernelChoice::Host) => {
            eprintln!("koi-kernel-run: the host kernel has ESP, GENEVE and openvswitch");
            ExitCode::SUCCESS
        }
        Ok(KernelChoice::Vm { .. }) => match GuestKernel::prepare(&GuestKernel::cache_dir()) {
            Ok(k) => {
                eprintln!(
                    "koi-kernel-run: guest kernel {} ready in {}",
                    k.release,
                    GuestKernel::cache_dir().display()
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("koi-kernel-run: {e}");
                ExitCode::from(2)
            }
        },
        Err(e) => {
            eprintln!("koi-kernel-run: {e}");
            ExitCode::from(2)
        }
    }
}
