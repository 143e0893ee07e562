//! The kernel the kernel checks run on has what they need: transport-mode
//! ESP carrying real traffic between two namespaces (SA byte counters
//! move), GENEVE links and the OVS kernel datapath. On this machine's
//! kernel (no ESP, GENEVE or openvswitch) that is Debian's stock kernel
//! booted under qemu by `testbed::guest`; where qemu or the kernel package
//! cannot be had, this fails with the reason — it never passes silently.

// A guest boot is measured in real time.
#![allow(clippy::disallowed_methods)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use testbed::guest::{GuestKernel, HostFeatures, KernelChoice, run_in_guest};

/// Two namespaces on a veth pair, ESP states and policies both ways, a
/// ping through them; a geneve link; an OVS kernel datapath.
const CHECKS: &str = r#"
set -u
K=0x0102030405060708090a0b0c0d0e0f1011121314
ip netns add koia; ip netns add koib
ip link add va type veth peer name vb
ip link set va netns koia; ip link set vb netns koib
ip -n koia addr add 10.9.0.1/24 dev va; ip -n koia link set va up; ip -n koia link set lo up
ip -n koib addr add 10.9.0.2/24 dev vb; ip -n koib link set vb up; ip -n koib link set lo up
for n in koia koib; do
  ip -n $n xfrm state add src 10.9.0.1 dst 10.9.0.2 proto esp spi 0x1001 reqid 7 mode transport aead 'rfc4106(gcm(aes))' $K 128 || exit 11
  ip -n $n xfrm state add src 10.9.0.2 dst 10.9.0.1 proto esp spi 0x1002 reqid 7 mode transport aead 'rfc4106(gcm(aes))' $K 128 || exit 11
done
ip -n koia xfrm policy add src 10.9.0.1 dst 10.9.0.2 dir out tmpl proto esp reqid 7 mode transport
ip -n koia xfrm policy add src 10.9.0.2 dst 10.9.0.1 dir in tmpl proto esp reqid 7 mode transport
ip -n koib xfrm policy add src 10.9.0.2 dst 10.9.0.1 dir out tmpl proto esp reqid 7 mode transport
ip -n koib xfrm policy add src 10.9.0.1 dst 10.9.0.2 dir in tmpl proto esp reqid 7 mode transport
ip netns exec koia ping -c 3 -W 3 10.9.0.2 > /dev/null && echo CHECK-ESP-PING
echo "CHECK-ESP-BYTES=$(ip -n koia -s xfrm state list src 10.9.0.1 dst 10.9.0.2 | grep -o '[0-9][0-9]*(bytes)' | head -1)"
ip -n koia link add gnv0 type geneve id 5 remote 10.9.0.2 && echo CHECK-GENEVE
ovs-dpctl add-dp system@koi-probe && ovs-dpctl del-dp system@koi-probe && echo CHECK-OVS-DATAPATH
"#;

#[test]
fn the_kernel_for_kernel_checks_has_esp_geneve_and_the_ovs_datapath() {
    let choice = KernelChoice::decide().unwrap();
    let text = match choice {
        KernelChoice::Host => {
            let f = HostFeatures::probe();
            assert!(f.complete(), "host chosen but incomplete: {f:?}");
            let out = std::process::Command::new("sh")
                .args(["-c", CHECKS])
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).into_owned()
        }
        KernelChoice::Vm { kvm } => {
            let kernel = GuestKernel::prepare(&GuestKernel::cache_dir())
                .expect("the guest kernel (qemu and Debian's kernel package can be installed here: scripts/install-deps.sh)");
            let mut out = Vec::new();
            let run = run_in_guest(
                &kernel,
                kvm,
                Path::new("/"),
                &["sh".into(), "-c".into(), CHECKS.into()],
                &[],
                Duration::from_secs(240),
                &mut out,
            )
            .expect("the guest runs");
            println!(
                "guest kernel {} ({}): booted to the command in {:.1} s, whole run {:.1} s",
                kernel.release,
                run.accel,
                run.boot.as_secs_f64(),
                run.total.as_secs_f64()
            );
            let text = String::from_utf8_lossy(&out).into_owned();
            assert_eq!(run.status, 0, "{text}");
            text
        }
    };
    for check in ["CHECK-ESP-PING", "CHECK-GENEVE", "CHECK-OVS-DATAPATH"] {
        assert!(
            text.lines().any(|l| l.trim() == check),
            "{check} missing:\n{text}"
        );
    }
    let bytes = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("CHECK-ESP-BYTES="))
        .and_then(|b| b.trim_end_matches("(bytes)").parse::<u64>().ok())
        .unwrap_or(0);
    assert!(bytes > 0, "the outbound ESP SA carried no bytes:\n{text}");
}
