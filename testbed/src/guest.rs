//! A full Linux kernel for the checks this machine's kernel cannot do
//! (kernel ESP, GENEVE, the OVS kernel datapath): the host's own kernel when
//! it has them, otherwise Debian's stock kernel booted under qemu
//! (TESTBED.md, "A full kernel under qemu").
//!
//! The guest sees the host's root read-only over 9p with a tmpfs overlay on
//! top, so the checkout, `target/` and every Debian package are at the same
//! paths inside; one command runs there, its output streams back on the
//! serial console, and its exit status is the guest's answer. The kernel
//! package is fetched with `apt-get download` and unpacked into a cache
//! directory — never installed into the host's `/boot`. The initramfs is
//! built at run time from `busybox-static` and the kernel's own modules.
//!
//! [`KernelChoice::decide`] probes the host (it tries the features, it does
//! not guess from the version) and honours `KUBE_OVN_IPSEC_KERNEL`
//! (`host`, `vm`; `vm-kvm` to boot the guest with KVM, which on nested
//! machines is slower than emulation — TESTBED.md — so TCG is the default).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::netns::{self, Netns};
use crate::require_program;

/// Environment variable that overrides the kernel choice.
pub const KERNEL_ENV: &str = "KUBE_OVN_IPSEC_KERNEL";
/// Environment variable naming the cache directory of the guest kernel.
pub const CACHE_ENV: &str = "KUBE_OVN_IPSEC_GUEST_CACHE";
/// Default cache directory of the guest kernel.
pub const DEFAULT_CACHE: &str = "/var/cache/kube-ovn-ipsec/guest";
/// The line the guest prints as the command starts.
const START_MARKER: &str = "KOI-GUEST-START";
/// The 9p mount tags of writable shares: `<tag><n>`.
const SHARE_TAG: &str = "koishare";
/// The line the guest prints with the command's exit status.
const EXIT_MARKER: &str = "KOI-GUEST-EXIT=";
/// Modules the initramfs loads to reach the host's root, in dependency
/// order (TESTBED.md).
const BOOT_MODULES: &[&str] = &[
    "drivers/virtio/virtio_ring.ko",
    "drivers/virtio/virtio.ko",
    "drivers/virtio/virtio_pci_modern_dev.ko",
    "drivers/virtio/virtio_pci_legacy_dev.ko",
    "drivers/virtio/virtio_pci.ko",
    "fs/netfs/netfs.ko",
    "fs/fscache/fscache.ko",
    "net/9p/9pnet.ko",
    "net/9p/9pnet_virtio.ko",
    "fs/9p/9p.ko",
    "fs/overlayfs/overlay.ko",
    "drivers/char/hw_random/virtio-rng.ko",
];
/// Modules the checks need, loaded inside the guest before the command.
const TEST_MODULES: &[&str] = &[
    "xfrm_user",
    "esp4",
    "esp6",
    "xfrm_interface",
    "geneve",
    "vxlan",
    "openvswitch",
    "veth",
];

/// Kernel crypto the IKE daemon's `af-alg` plugin probes at start-up. Each
/// probe makes the kernel run modprobe, which under emulation costs up to
/// seconds: charon then misses strongSwan starter's 10 s start limit.
/// Loaded in one `modprobe -a` before the command, the cost is paid once.
const CRYPTO_MODULES: &[&str] = &[
    "af_alg",
    "algif_hash",
    "algif_skcipher",
    "blowfish_generic",
    "blowfish_x86_64",
    "camellia_generic",
    "camellia_x86_64",
    "camellia_aesni_avx_x86_64",
    "camellia_aesni_avx2",
    "cast5_generic",
    "cast5_avx_x86_64",
    "ctr",
    "des_generic",
    "ecb",
    "md4",
    "serpent_generic",
    "serpent_sse2_x86_64",
    "serpent_avx_x86_64",
    "serpent_avx2",
    "sha512_generic",
    "sha512_ssse3",
    "twofish_generic",
    "twofish_x86_64",
    "twofish_x86_64_3way",
    "twofish_avx_x86_64",
    "xcbc",
];

/// Why a guest could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GuestError {
    /// A program the guest needs is missing.
    #[error(transparent)]
    Missing(#[from] crate::MissingProgram),
    /// A step of preparing or running the guest failed.
    #[error("guest kernel: {step}: {detail}")]
    Step {
        /// What was being done.
        step: &'static str,
        /// What went wrong.
        detail: String,
    },
    /// The command did not finish in time; the guest was killed.
    #[error("guest kernel: the command did not finish within {0:?}; the guest was killed")]
    Timeout(Duration),
    /// The guest ended without reporting the command's exit status (it
    /// crashed, or the command killed it).
    #[error("guest kernel: the guest ended without an exit status (see its console output above)")]
    NoExitStatus,
}

fn step(step: &'static str) -> impl FnOnce(std::io::Error) -> GuestError {
    move |e| GuestError::Step {
        step,
        detail: e.to_string(),
    }
}

/// Which kernel the kernel checks run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelChoice {
    /// The host's kernel has every feature.
    Host,
    /// A guest under qemu.
    Vm {
        /// Boot with KVM instead of TCG.
        kvm: bool,
    },
}

/// What the host kernel can do, probed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostFeatures {
    /// A transport-mode ESP state with `rfc4106(gcm(aes))` can be added.
    pub esp: bool,
    /// A geneve link can be created.
    pub geneve: bool,
    /// The openvswitch datapath module is loaded or loadable.
    pub openvswitch: bool,
}

impl HostFeatures {
    /// Tries each feature in a throwaway network namespace.
    pub fn probe() -> HostFeatures {
        let Ok(ns) = Netns::create("koi-kernel-probe") else {
            return HostFeatures {
                esp: false,
                geneve: false,
                openvswitch: false,
            };
        };
        let ok = |args: &[&str]| ns.run("ip", args).is_ok_and(|o| o.status.success());
        let esp = ok(&[
            "xfrm",
            "state",
            "add",
            "src",
            "10.0.0.1",
            "dst",
            "10.0.0.2",
            "proto",
            "esp",
            "spi",
            "0x100",
            "reqid",
            "1",
            "mode",
            "transport",
            "aead",
            "rfc4106(gcm(aes))",
            "0x0102030405060708090a0b0c0d0e0f1011121314",
            "128",
        ]);
        let geneve = ok(&[
            "link", "add", "koiprobe", "type", "geneve", "id", "1", "remote", "10.0.0.2",
        ]);
        let openvswitch = Path::new("/sys/module/openvswitch").exists()
            || netns::run(Command::new("modprobe").arg("openvswitch")).is_ok();
        HostFeatures {
            esp,
            geneve,
            openvswitch,
        }
    }

    /// Every feature the kernel checks need.
    pub fn complete(&self) -> bool {
        self.esp && self.geneve && self.openvswitch
    }
}

impl KernelChoice {
    /// `KUBE_OVN_IPSEC_KERNEL` if set (`host`, `vm`, `vm-kvm`), otherwise
    /// the host when it has every feature, otherwise a TCG guest.
    pub fn decide() -> Result<KernelChoice, GuestError> {
        Self::decide_from(std::env::var(KERNEL_ENV).ok().as_deref(), || {
            HostFeatures::probe().complete()
        })
    }

    /// The decision for an override value and a host probe (called only
    /// without an override).
    fn decide_from(
        over: Option<&str>,
        host_complete: impl FnOnce() -> bool,
    ) -> Result<KernelChoice, GuestError> {
        match over {
            Some("host") => Ok(KernelChoice::Host),
            Some("vm") => Ok(KernelChoice::Vm { kvm: false }),
            Some("vm-kvm") => Ok(KernelChoice::Vm { kvm: true }),
            Some(other) => Err(GuestError::Step {
                step: "reading KUBE_OVN_IPSEC_KERNEL",
                detail: format!("`{other}` is not one of host, vm, vm-kvm"),
            }),
            None if host_complete() => Ok(KernelChoice::Host),
            None => Ok(KernelChoice::Vm { kvm: false }),
        }
    }
}

/// Debian's kernel package, unpacked in the cache.
#[derive(Debug, Clone)]
pub struct GuestKernel {
    /// `vmlinuz-<release>`.
    pub vmlinuz: PathBuf,
    /// The unpacked `lib/modules/<release>`.
    pub modules: PathBuf,
    /// The kernel release (`6.1.0-57-amd64`).
    pub release: String,
}

fn output(cmd: &mut Command, what: &'static str) -> Result<String, GuestError> {
    let out = cmd.output().map_err(step(what))?;
    if !out.status.success() {
        return Err(GuestError::Step {
            step: what,
            detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl GuestKernel {
    /// The cache directory (`KUBE_OVN_IPSEC_GUEST_CACHE` or the default).
    pub fn cache_dir() -> PathBuf {
        std::env::var_os(CACHE_ENV)
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_CACHE))
    }

    /// The kernel package `linux-image-amd64` depends on, unpacked in
    /// `cache` (downloaded with `apt-get download` the first time).
    pub fn prepare(cache: &Path) -> Result<GuestKernel, GuestError> {
        for p in ["apt-cache", "apt-get", "dpkg-deb", "depmod"] {
            require_program(p)?;
        }
        let deps = output(
            Command::new("apt-cache").args(["depends", "linux-image-amd64"]),
            "apt-cache depends linux-image-amd64",
        )?;
        let package = deps
            .lines()
            .filter_map(|l| l.trim().strip_prefix("Depends: "))
            .find(|d| d.starts_with("linux-image-"))
            .ok_or_else(|| GuestError::Step {
                step: "finding the kernel package",
                detail: "linux-image-amd64 names no linux-image-* dependency".into(),
            })?
            .to_string();
        let release = package.trim_start_matches("linux-image-").to_string();
        let root = cache.join(&package);
        let vmlinuz = root.join("boot").join(format!("vmlinuz-{release}"));
        let modules = root.join("lib/modules").join(&release);
        if !modules.join("modules.dep").is_file() || !vmlinuz.is_file() {
            std::fs::create_dir_all(cache).map_err(step("creating the kernel cache"))?;
            let deb = Self::download(cache, &package)?;
            let _ = std::fs::remove_dir_all(&root);
            output(
                Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root),
                "unpacking the kernel package",
            )?;
            output(
                Command::new("depmod").arg("-b").arg(&root).arg(&release),
                "depmod of the unpacked kernel",
            )?;
        }
        Ok(GuestKernel {
            vmlinuz,
            modules,
            release,
        })
    }

    fn download(cache: &Path, package: &str) -> Result<PathBuf, GuestError> {
        let find = || {
            std::fs::read_dir(cache).ok().and_then(|d| {
                d.filter_map(Result::ok).map(|e| e.path()).find(|p| {
                    p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                        n.starts_with(&format!("{package}_")) && n.ends_with(".deb")
                    })
                })
            })
        };
        if let Some(deb) = find() {
            return Ok(deb);
        }
        output(
            Command::new("apt-get")
                .args(["download", "-q", package])
                .current_dir(cache),
            "apt-get download of the kernel package",
        )?;
        find().ok_or_else(|| GuestError::Step {
            step: "apt-get download of the kernel package",
            detail: format!("no {package}_*.deb in {}", cache.display()),
        })
    }
}

/// The initramfs' `/init`: busybox mounts the host's root read-only over
/// 9p under a tmpfs overlay and switches to it, running `stage2`.
fn init_script(stage2: &Path) -> String {
    let insmods: String = BOOT_MODULES
        .iter()
        .map(|m| {
            let name = Path::new(m)
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or(m);
            format!("insmod /modules/{name}\n")
        })
        .collect();
    format!(
        "#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
{insmods}mkdir -p /lower /rw /newroot
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 hostroot /lower
mount -t tmpfs -o size=512m rw /rw
mkdir -p /rw/upper /rw/work
mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work overlay /newroot
mount --move /dev /newroot/dev
exec switch_root /newroot /bin/sh {stage2}
",
        stage2 = stage2.display()
    )
}

/// The guest's second stage, run from the host's root: the test's
/// environment, the kernel's modules, the command, its exit status.
fn stage2_script(
    kernel: &GuestKernel,
    cwd: &Path,
    command: &[String],
    env: &[(String, String)],
    writable: &[&Path],
) -> String {
    let shares: String = writable
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let p = shell_quote(&p.display().to_string());
            format!(
                "mkdir -p {p} && mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 {SHARE_TAG}{i} {p}\n"
            )
        })
        .collect();
    let quoted: Vec<String> = command.iter().map(|a| shell_quote(a)).collect();
    let exports: String = env
        .iter()
        .map(|(k, v)| format!("export {k}={}\n", shell_quote(v)))
        .collect();
    // After the power-off request init waits in a builtin loop: a `sleep`
    // is paged in from the 9p root the shutdown tears down, fails with EIO,
    // and init's exit panics the kernel onto the console the lab relays.
    format!(
        "mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t tmpfs run /run
mkdir -p /run/netns /run/lock
mount --bind {modules} /lib/modules/{release} 2>/dev/null || {{ mkdir -p /lib/modules/{release} && mount --bind {modules} /lib/modules/{release}; }}
{shares}ip link set lo up
modprobe -a -q {test_modules} {crypto_modules}
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root
{exports}cd {cwd}
echo {start}
{command}
echo {marker}$?
echo o > /proc/sysrq-trigger
while :; do :; done
",
        modules = shell_quote(&kernel.modules.display().to_string()),
        release = kernel.release,
        test_modules = TEST_MODULES.join(" "),
        crypto_modules = CRYPTO_MODULES.join(" "),
        cwd = shell_quote(&cwd.display().to_string()),
        command = quoted.join(" "),
        marker = EXIT_MARKER,
        start = START_MARKER,
    )
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// How a guest run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestRun {
    /// The command's exit status inside the guest.
    pub status: i32,
    /// From qemu's start to the command's start.
    pub boot: Duration,
    /// From qemu's start to the guest's end.
    pub total: Duration,
    /// `tcg` or `kvm`.
    pub accel: &'static str,
}

/// A running qemu, killed when dropped (also when the caller panics).
struct Qemu(Child);

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// How a bench binary that needs ESP, GENEVE and openvswitch runs, as its
/// `main`: `here`, on a two-worker runtime, when this kernel has them; otherwise, run as a bench
/// (`--bench` among `args`), `before_guest` with the prepared guest kernel
/// and then this same binary with `--bench` inside the TCG guest, bounded
/// by `limit`, an error if it fails there; under `cargo test` (no
/// `--bench`) on a kernel without them, `name` says where it runs and
/// nothing else happens.
pub fn bench_on_full_kernel(
    name: &str,
    args: &[String],
    limit: Duration,
    here: impl std::future::Future<Output = ()>,
    before_guest: impl FnOnce(&GuestKernel),
) -> Result<(), GuestError> {
    let features = HostFeatures::probe();
    if features.complete() {
        // Two workers: the benches' daemons and probes run beside them on
        // a two-core machine.
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| GuestError::Step {
                step: "starting the bench's runtime",
                detail: e.to_string(),
            })?
            .block_on(here);
        return Ok(());
    }
    if !args.iter().any(|a| a == "--bench") {
        println!(
            "{name}: this kernel lacks {features:?}; scripts/kernel-tests.sh runs `{name} \
             --quick` on a full kernel, scripts/bench.sh the full bench"
        );
        return Ok(());
    }
    let kernel = GuestKernel::prepare(&GuestKernel::cache_dir())?;
    before_guest(&kernel);
    let step = |what: &'static str, e: std::io::Error| GuestError::Step {
        step: what,
        detail: e.to_string(),
    };
    let exe = std::env::current_exe().map_err(|e| step("locating the bench binary", e))?;
    let cwd = std::env::current_dir().map_err(|e| step("the working directory", e))?;
    let run = run_in_guest(
        &kernel,
        false,
        &cwd,
        &[exe.display().to_string(), "--bench".to_string()],
        &[],
        limit,
        &mut std::io::stdout(),
    )?;
    if run.status != 0 {
        return Err(GuestError::Step {
            step: "the bench in the guest",
            detail: format!("{name} exited with {}", run.status),
        });
    }
    Ok(())
}

/// Runs `command` (program and arguments) in a guest booted from `kernel`,
/// in `cwd`, with `env` exported; streams the guest's console to `out`;
/// bounded by `timeout`.
pub fn run_in_guest(
    kernel: &GuestKernel,
    kvm: bool,
    cwd: &Path,
    command: &[String],
    env: &[(String, String)],
    timeout: Duration,
    out: &mut dyn Write,
) -> Result<GuestRun, GuestError> {
    run_in_guest_sharing(kernel, kvm, cwd, command, env, &[], timeout, out)
}

/// [`run_in_guest`], with each of `writable` (absolute host directories)
/// shared writable into the guest at the same path: what the command
/// writes there outlives the guest (its root is a throwaway overlay).
#[allow(clippy::too_many_arguments)]
pub fn run_in_guest_sharing(
    kernel: &GuestKernel,
    kvm: bool,
    cwd: &Path,
    command: &[String],
    env: &[(String, String)],
    writable: &[&Path],
    timeout: Duration,
    out: &mut dyn Write,
) -> Result<GuestRun, GuestError> {
    if let Some(p) = writable.iter().find(|p| !p.is_absolute() || !p.is_dir()) {
        return Err(GuestError::Step {
            step: "sharing a directory with the guest",
            detail: format!("{} is not an absolute path of a directory", p.display()),
        });
    }
    for p in ["qemu-system-x86_64", "busybox", "cpio"] {
        require_program(p)?;
    }
    let work = tempfile::Builder::new()
        .prefix("koi-guest-")
        .tempdir()
        .map_err(step("creating the guest's work directory"))?;
    let stage2 = work.path().join("stage2.sh");
    std::fs::write(&stage2, stage2_script(kernel, cwd, command, env, writable))
        .map_err(step("writing the guest's second stage"))?;
    let initrd = build_initramfs(kernel, work.path(), &stage2)?;
    let (accel, cpu) = if kvm {
        ("kvm", "host,-arch-capabilities")
    } else {
        ("tcg,thread=multi", "max")
    };
    let started = Instant::now();
    let mut qemu = Command::new(require_program("qemu-system-x86_64")?);
    for (i, dir) in writable.iter().enumerate() {
        qemu.arg("-virtfs").arg(format!(
            "local,path={},mount_tag={SHARE_TAG}{i},security_model=none,multidevs=remap",
            dir.display()
        ));
    }
    let mut child = qemu
        // Under KVM `-cpu max` asks for MSR 0x10a (arch capabilities),
        // which nested KVM here refuses ("failed to set MSR 0x10a").
        .args(["-accel", accel, "-cpu", cpu, "-m", "2048", "-smp", "2"])
        .args(["-nographic", "-no-reboot"])
        // Entropy from the host: a fresh guest's CRNG would otherwise make
        // the first getrandom() callers (charon, TLS) wait.
        .args(["-device", "virtio-rng-pci"])
        .arg("-kernel")
        .arg(&kernel.vmlinuz)
        .arg("-initrd")
        .arg(&initrd)
        .args(["-append", "console=ttyS0 panic=-1 quiet"])
        .args([
            "-virtfs",
            "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(step("starting qemu-system-x86_64"))?;
    let stdout = child.stdout.take().ok_or_else(|| GuestError::Step {
        step: "reading the guest console",
        detail: "no stdout".into(),
    })?;
    let _qemu = Qemu(child);
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut boot = None;
    let mut status = None;
    loop {
        let left = timeout.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Err(GuestError::Timeout(timeout));
        }
        match rx.recv_timeout(left) {
            Ok(line) => {
                // The console may put terminal escapes before a line.
                let line = line.trim_end_matches('\r');
                if line.ends_with(START_MARKER) {
                    boot = Some(started.elapsed());
                    continue;
                }
                if let Some(at) = line.find(EXIT_MARKER) {
                    status = line[at + EXIT_MARKER.len()..].trim().parse().ok();
                    continue;
                }
                let _ = writeln!(out, "{line}");
            }
            Err(mpsc::RecvTimeoutError::Timeout) => return Err(GuestError::Timeout(timeout)),
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    let status = status.ok_or(GuestError::NoExitStatus)?;
    Ok(GuestRun {
        status,
        boot: boot.unwrap_or_default(),
        total: started.elapsed(),
        accel: if kvm { "kvm" } else { "tcg" },
    })
}

/// The initramfs: busybox, the boot modules and `/init`, as an
/// uncompressed newc cpio (the kernel takes it as is).
fn build_initramfs(
    kernel: &GuestKernel,
    work: &Path,
    stage2: &Path,
) -> Result<PathBuf, GuestError> {
    let root = work.join("initramfs");
    for d in ["bin", "proc", "sys", "dev", "modules"] {
        std::fs::create_dir_all(root.join(d)).map_err(step("laying out the initramfs"))?;
    }
    std::fs::copy(require_program("busybox")?, root.join("bin/busybox"))
        .map_err(step("copying busybox into the initramfs"))?;
    for m in BOOT_MODULES {
        let from = kernel.modules.join("kernel").join(m);
        let name = Path::new(m).file_name().unwrap_or_default();
        std::fs::copy(&from, root.join("modules").join(name)).map_err(|e| GuestError::Step {
            step: "copying a boot module into the initramfs",
            detail: format!("{}: {e}", from.display()),
        })?;
    }
    let init = root.join("init");
    std::fs::write(&init, init_script(stage2)).map_err(step("writing /init"))?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&init, std::fs::Permissions::from_mode(0o755))
            .map_err(step("making /init executable"))?;
    }
    let image = work.join("initrd.cpio");
    let list = output(
        Command::new("find").arg(".").current_dir(&root),
        "listing the initramfs",
    )?;
    let file = std::fs::File::create(&image).map_err(step("creating the initramfs image"))?;
    let mut cpio = Command::new(require_program("cpio")?)
        .args(["-o", "-H", "newc", "--quiet"])
        .current_dir(&root)
        .stdin(Stdio::piped())
        .stdout(file)
        .spawn()
        .map_err(step("running cpio"))?;
    if let Some(mut stdin) = cpio.stdin.take() {
        stdin
            .write_all(list.as_bytes())
            .map_err(step("feeding cpio"))?;
    }
    let st = cpio.wait().map_err(step("running cpio"))?;
    if !st.success() {
        return Err(GuestError::Step {
            step: "running cpio",
            detail: format!("exit {st}"),
        });
    }
    Ok(image)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_single_quotes() {
        assert_eq!(shell_quote("a'b"), "'a'\\''b'");
    }

    #[test]
    fn init_loads_the_boot_modules_in_order() {
        let s = init_script(Path::new("/tmp/x/stage2.sh"));
        let virtio = s.find("insmod /modules/virtio_ring.ko").unwrap();
        let p9 = s.find("insmod /modules/9p.ko").unwrap();
        let overlay = s.find("insmod /modules/overlay.ko").unwrap();
        assert!(virtio < p9 && p9 < overlay, "{s}");
        assert!(s.contains("switch_root /newroot /bin/sh /tmp/x/stage2.sh"));
    }

    #[test]
    fn the_override_wins_and_a_bad_one_is_refused() {
        let never = || panic!("probed despite an override");
        assert_eq!(
            KernelChoice::decide_from(Some("host"), never).unwrap(),
            KernelChoice::Host
        );
        assert_eq!(
            KernelChoice::decide_from(Some("vm-kvm"), never).unwrap(),
            KernelChoice::Vm { kvm: true }
        );
        let err = KernelChoice::decide_from(Some("sometimes"), never).unwrap_err();
        assert!(
            err.to_string().contains("not one of host, vm, vm-kvm"),
            "{err}"
        );
        assert_eq!(
            KernelChoice::decide_from(None, || false).unwrap(),
            KernelChoice::Vm { kvm: false }
        );
        assert_eq!(
            KernelChoice::decide_from(None, || true).unwrap(),
            KernelChoice::Host
        );
    }
}
