//! `process_*`: the daemon's own CPU, memory, file descriptors and start time, read from
//! `/proc/self` at each scrape.

/// `process_*` as Prometheus client libraries export them, read from `/proc/self` at each
/// scrape (no crate: the prometheus crate's `process` feature would pull in `procfs`). Where
/// `/proc/self/stat` cannot be read, it exports nothing.
pub(super) struct ProcessCollector {
    cpu: prometheus::Counter,
    resident: prometheus::IntGauge,
    virtual_memory: prometheus::IntGauge,
    open_fds: prometheus::IntGauge,
    max_fds: prometheus::IntGauge,
    start_time: prometheus::Gauge,
    /// One scrape at a time moves the CPU counter (it only goes up by deltas).
    update: parking_lot::Mutex<()>,
}

impl ProcessCollector {
    pub(super) fn new() -> ProcessCollector {
        let int =
            |name: &str, help: &str| prometheus::IntGauge::new(name, help).expect("valid gauge");
        ProcessCollector {
            cpu: prometheus::Counter::new(
                "process_cpu_seconds_total",
                "Total user and system CPU time spent in seconds",
            )
            .expect("valid counter"),
            resident: int(
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
            ),
            virtual_memory: int(
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
            ),
            open_fds: int("process_open_fds", "Number of open file descriptors"),
            max_fds: int(
                "process_max_fds",
                "Maximum number of open file descriptors (the soft limit)",
            ),
            start_time: prometheus::Gauge::new(
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
            )
            .expect("valid gauge"),
            update: parking_lot::Mutex::new(()),
        }
    }
}

/// What `/proc/self` says of this process.
#[derive(Debug, PartialEq)]
struct ProcStat {
    cpu_seconds: f64,
    resident_bytes: i64,
    virtual_bytes: i64,
    start_time_seconds: f64,
}

/// Parses `/proc/self/stat` (`proc(5)`): fields after the parenthesised command name, whose
/// `utime`, `stime` and `starttime` are in clock ticks and `rss` in pages; `boot_time` is
/// `btime` from `/proc/stat`.
fn parse_proc_stat(stat: &str, ticks: f64, page: i64, boot_time: f64) -> Option<ProcStat> {
    // The command name may hold spaces and ')': the fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // f[0] is field 3 (state): field n is f[n - 3].
    let num = |n: usize| f.get(n - 3)?.parse::<u64>().ok();
    Some(ProcStat {
        cpu_seconds: (num(14)? + num(15)?) as f64 / ticks,
        virtual_bytes: i64::try_from(num(23)?).ok()?,
        resident_bytes: i64::try_from(num(24)?).ok()?.saturating_mul(page),
        start_time_seconds: boot_time + num(22)? as f64 / ticks,
    })
}

/// `btime` of `/proc/stat`: the boot time in seconds since the epoch.
fn boot_time(proc_stat: &str) -> Option<f64> {
    proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

impl prometheus::core::Collector for ProcessCollector {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        let mut d = self.cpu.desc();
        d.extend(self.resident.desc());
        d.extend(self.virtual_memory.desc());
        d.extend(self.open_fds.desc());
        d.extend(self.max_fds.desc());
        d.extend(self.start_time.desc());
        d
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        let _one = self.update.lock();
        // SAFETY: sysconf and getrlimit only read process-wide values into the arguments given.
        let (ticks, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        let boot = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| boot_time(&s));
        let stat = std::fs::read_to_string("/proc/self/stat").ok();
        let (Some(stat), Some(boot)) = (stat, boot) else {
            return Vec::new();
        };
        let Some(p) = parse_proc_stat(&stat, ticks.max(1) as f64, page.max(1), boot) else {
            return Vec::new();
        };
        let past = self.cpu.get();
        if p.cpu_seconds > past {
            self.cpu.inc_by(p.cpu_seconds - past);
        }
        self.resident.set(p.resident_bytes);
        self.virtual_memory.set(p.virtual_bytes);
        self.start_time.set(p.start_time_seconds);
        let mut out = Vec::new();
        out.extend(self.cpu.collect());
        out.extend(self.resident.collect());
        out.extend(self.virtual_memory.collect());
        out.extend(self.start_time.collect());
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            self.open_fds
                .set(i64::try_from(fds.count()).unwrap_or(i64::MAX));
            out.extend(self.open_fds.collect());
        }
        let mut limit: libc::rlimit = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
            self.max_fds
                .set(i64::try_from(limit.rlim_cur).unwrap_or(i64::MAX));
            out.extend(self.max_fds.collect());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_gives_cpu_seconds_resident_bytes_and_start_time() {
        // A command name with a space and a ')' in it, as proc(5) allows.
        let stat = "4242 (nokv) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 150 0 0 20 0 7 0 \
                    1000 123456789 300 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0";
        let p = parse_proc_stat(stat, 100.0, 4096, 1_700_000_000.0).unwrap();
        assert_eq!(
            p,
            ProcStat {
                cpu_seconds: 4.0,
                resident_bytes: 300 * 4096,
                virtual_bytes: 123_456_789,
                start_time_seconds: 1_700_000_010.0,
            }
        );
        assert_eq!(
            boot_time("cpu 1 2\nbtime 1700000000\nprocesses 9\n"),
            Some(1.7e9)
        );
        assert_eq!(parse_proc_stat("garbage", 100.0, 4096, 0.0), None);
    }
}
