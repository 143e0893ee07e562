//! The kernel's XFRM error counters, `/proc/net/xfrm_stat` of one network
//! namespace (one `Name<whitespace>value` line per counter). Pure parsing:
//! the reader opens the file in the namespace it cares about (`/proc/net`
//! is the reading process's namespace).
//!
//! The counters are how the data path shows what the policies alone do not:
//! `XfrmOutPolBlock` grows when the guards drop marked packets that no
//! IPsec policy with an SA claimed (the IKE daemon down, no CHILD_SA),
//! `XfrmInNoStates` when ESP arrives for an SA this node no longer has.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;

use crate::Error;

pub use kube_ovn_ipsec_api::datapath::{
    IN_NO_STATES, IN_TMPL_MISMATCH, OUT_NO_STATES, OUT_POL_BLOCK,
};

/// One reading of the counters, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct XfrmStats(BTreeMap<String, u64>);

/// Why a counters file could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("xfrm_stat line {line}: {reason}")]
pub struct StatError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong with it.
    pub reason: String,
}

impl XfrmStats {
    /// Parses the text of `/proc/net/xfrm_stat`. A line that is not a name
    /// and an unsigned number is an error (naming the line) rather than a
    /// silently missing counter; blank lines are ignored.
    pub fn parse(text: &str) -> Result<Self, StatError> {
        let mut out = BTreeMap::new();
        for (i, line) in text.lines().enumerate() {
            let mut fields = line.split_whitespace();
            let Some(name) = fields.next() else {
                continue;
            };
            let err = |reason: String| StatError {
                line: i + 1,
                reason,
            };
            let value = fields
                .next()
                .ok_or_else(|| err(format!("{name} has no value")))?;
            let value = value
                .parse::<u64>()
                .map_err(|_| err(format!("{name} value {value:?} is not a counter")))?;
            if fields.next().is_some() {
                return Err(err(format!("{name} has more than one value")));
            }
            out.insert(name.to_string(), value);
        }
        Ok(Self(out))
    }

    /// The counter `name`, 0 when the kernel does not report it.
    pub fn get(&self, name: &str) -> u64 {
        self.0.get(name).copied().unwrap_or(0)
    }

    /// How much each counter grew since `earlier`, only those that did (a
    /// counter that went down — a namespace recreated — counts from 0).
    pub fn growth_since(&self, earlier: &XfrmStats) -> BTreeMap<String, u64> {
        self.0
            .iter()
            .filter_map(|(name, now)| {
                let grew = kube_ovn_ipsec_api::datapath::counter_growth(earlier.get(name), *now);
                (grew > 0).then(|| (name.clone(), grew))
            })
            .collect()
    }

    /// Every counter, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, u64)> {
        self.0.iter().map(|(k, v)| (k.as_str(), *v))
    }

    /// The counters as a map, by name.
    pub fn into_map(self) -> BTreeMap<String, u64> {
        self.0
    }
}

/// The counters file of one network namespace, kept open: the file shows
/// the namespace of the thread that opened it, whichever thread reads it
/// later, and is read again from the start for each sample.
#[derive(Debug)]
pub struct StatFile {
    file: File,
}

/// Where the calling thread's counters are.
const STAT_PATH: &str = "/proc/thread-self/net/xfrm_stat";

impl StatFile {
    /// Opens the counters of the named network namespace (`None`: the
    /// calling thread's). `Ok(None)` when the kernel keeps none
    /// (`CONFIG_XFRM_STATISTICS` off): the data path is then judged from
    /// SA counters alone.
    pub fn open(netns: Option<&str>) -> Result<Option<Self>, Error> {
        let open = || match File::open(STAT_PATH) {
            Ok(file) => Ok(Some(StatFile { file })),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(Error::Io {
                path: PathBuf::from(STAT_PATH),
                source,
            }),
        };
        match netns {
            Some(name) => crate::netns::run_in(name, open),
            None => open(),
        }
    }

    /// Reads the counters now. A file that does not parse is an error
    /// naming the line, never a silently missing counter.
    pub fn read(&mut self) -> Result<XfrmStats, Error> {
        let io = |source| Error::Io {
            path: PathBuf::from(STAT_PATH),
            source,
        };
        self.file.seek(SeekFrom::Start(0)).map_err(io)?;
        let mut text = String::new();
        self.file.read_to_string(&mut text).map_err(io)?;
        XfrmStats::parse(&text).map_err(|e| Error::Io {
            path: PathBuf::from(STAT_PATH),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "XfrmInError             \t0\nXfrmInNoStates          \t3\n\
                          XfrmOutPolBlock         \t12\nXfrmOutNoStates         \t0\n";

    #[test]
    fn parses_the_kernel_format() {
        let s = XfrmStats::parse(SAMPLE).unwrap();
        assert_eq!(s.get(OUT_POL_BLOCK), 12);
        assert_eq!(s.get(IN_NO_STATES), 3);
        assert_eq!(s.get("XfrmFwdHdrError"), 0);
        assert_eq!(s.iter().count(), 4);
    }

    #[test]
    fn growth_names_only_what_grew() {
        let before = XfrmStats::parse(SAMPLE).unwrap();
        let after = XfrmStats::parse(
            "XfrmInError 0\nXfrmInNoStates 3\nXfrmOutPolBlock 20\nXfrmOutNoStates 1\n",
        )
        .unwrap();
        let g = after.growth_since(&before);
        assert_eq!(g.len(), 2);
        assert_eq!(g[OUT_POL_BLOCK], 8);
        assert_eq!(g[OUT_NO_STATES], 1);
        // A reset counter counts from zero, never underflows.
        assert_eq!(before.growth_since(&after)[OUT_POL_BLOCK], 12);
    }

    #[test]
    fn the_open_file_is_read_again_from_the_start() {
        let Some(mut f) = StatFile::open(None).unwrap() else {
            return; // a kernel without XFRM statistics
        };
        let first = f.read().unwrap();
        let second = f.read().unwrap();
        assert!(first.get(OUT_POL_BLOCK) <= second.get(OUT_POL_BLOCK));
        assert_eq!(first.iter().count(), second.iter().count());
        assert!(first.iter().count() > 10, "{first:?}");
    }

    #[test]
    fn malformed_lines_are_named() {
        let e = XfrmStats::parse("XfrmInError 0\nXfrmOutPolBlock -1\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.reason.contains("XfrmOutPolBlock"), "{e}");
        assert!(XfrmStats::parse("XfrmInError\n").is_err());
        assert!(XfrmStats::parse("XfrmInError 1 2\n").is_err());
        assert_eq!(XfrmStats::parse("\n\n").unwrap(), XfrmStats::default());
    }
}
