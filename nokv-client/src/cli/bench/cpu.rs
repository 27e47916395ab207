//! CPU time per operation: how much processor time a process spent (user + system, all its
//! threads) across one measurement, divided by the operations that measurement completed.
//!
//! Read from `/proc/PID/stat` (Linux only; elsewhere the figures are absent, never guessed).
//! The server side is the daemon or etcd the bench started; the client side is this bench
//! process itself (`/proc/self/stat`), so the clients' own cost is visible next to the
//! server's: on a small box they share the same cores.

use std::path::PathBuf;

/// utime + stime (fields 14 and 15 of `proc(5)`'s stat line), in clock ticks.
///
/// Field 2 (comm) is the executable name in parentheses and may itself contain spaces and
/// parentheses, so fields are counted after the *last* `)`: the first field after it is
/// field 3 (state), which puts utime at index 11 and stime at index 12.
pub fn parse_stat_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`), the unit of `/proc/PID/stat` times.
/// Falls back to 100, Linux's value on every common architecture, if sysconf fails.
pub fn ticks_per_second() -> f64 {
    // SAFETY: sysconf only reads a system constant; it has no memory-safety preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// CPU milliseconds per operation for `ticks` spent over `ops` operations; absent when
/// nothing completed (a ratio over zero operations means nothing).
pub fn ms_per_op(ticks: u64, ticks_per_s: f64, ops: usize) -> Option<f64> {
    (ops > 0 && ticks_per_s > 0.0).then(|| ticks as f64 * 1000.0 / ticks_per_s / ops as f64)
}

/// One process's CPU clock.
#[derive(Debug, Clone)]
pub struct CpuClock(PathBuf);

impl CpuClock {
    /// A process this bench started (the daemon, etcd).
    pub fn of_pid(pid: u32) -> CpuClock {
        CpuClock(PathBuf::from(format!("/proc/{pid}/stat")))
    }

    /// This bench process: every client task and its runtime threads.
    pub fn of_self() -> CpuClock {
        CpuClock(PathBuf::from("/proc/self/stat"))
    }

    /// The calling thread alone (`/proc/thread-self/stat`): for work a bench does on one
    /// thread of its own, apart from its client tasks. Read it from that thread only.
    pub fn of_this_thread() -> CpuClock {
        CpuClock(PathBuf::from("/proc/thread-self/stat"))
    }

    /// Ticks used so far; absent if the process is gone or `/proc` is not there.
    pub fn ticks(&self) -> Option<u64> {
        parse_stat_ticks(&std::fs::read_to_string(&self.0).ok()?)
    }
}

/// The server's and the client's CPU across one measurement.
pub struct CpuMeter {
    server: CpuClock,
    client: CpuClock,
    start: (Option<u64>, Option<u64>),
}

/// CPU per operation of one measurement, in milliseconds (JSON: `null` when unknown).
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct CpuPerOp {
    pub server_cpu_ms_per_op: Option<f64>,
    pub client_cpu_ms_per_op: Option<f64>,
}

impl CpuMeter {
    /// Starts measuring the process `server_pid` and this process.
    pub fn start(server_pid: u32) -> CpuMeter {
        let (server, client) = (CpuClock::of_pid(server_pid), CpuClock::of_self());
        let start = (server.ticks(), client.ticks());
        CpuMeter {
            server,
            client,
            start,
        }
    }

    /// CPU spent since `start`, divided by the `ops` completed meanwhile.
    pub fn finish(self, ops: usize) -> CpuPerOp {
        self.spent().per_op(ops)
    }

    /// Ticks each side spent since `start` (to pool several rounds before dividing).
    pub fn spent(self) -> CpuTicks {
        let delta = |before: Option<u64>, after: Option<u64>| after?.checked_sub(before?);
        CpuTicks {
            server: delta(self.start.0, self.server.ticks()),
            client: delta(self.start.1, self.client.ticks()),
        }
    }
}

/// Clock ticks the server and the client spent, pooled over rounds; a side is unknown as
/// soon as one of its rounds is.
#[derive(Debug, Clone, Copy)]
pub struct CpuTicks {
    pub server: Option<u64>,
    pub client: Option<u64>,
}

impl Default for CpuTicks {
    fn default() -> CpuTicks {
        CpuTicks {
            server: Some(0),
            client: Some(0),
        }
    }
}

impl CpuTicks {
    pub fn add(&mut self, other: CpuTicks) {
        self.server = self.server.zip(other.server).map(|(a, b)| a + b);
        self.client = self.client.zip(other.client).map(|(a, b)| a + b);
    }

    pub fn per_op(self, ops: usize) -> CpuPerOp {
        let hz = ticks_per_second();
        CpuPerOp {
            server_cpu_ms_per_op: self.server.and_then(|t| ms_per_op(t, hz, ops)),
            client_cpu_ms_per_op: self.client.and_then(|t| ms_per_op(t, hz, ops)),
        }
    }
}

/// The whole machine's CPU time by state over one bench run, from the aggregate `cpu` line of
/// `/proc/stat`: how busy the cores were, how much was idle, and how much the hypervisor took
/// (`steal`). Steal is time this VM's cores wanted to run and could not, so it inflates every
/// latency and CPU-per-operation figure of the run; it is printed with each report so a figure
/// can be compared with a run on another machine of the same kind, or discounted.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct MachineShare {
    pub busy_pct: f64,
    pub idle_pct: f64,
    pub steal_pct: f64,
}

impl MachineShare {
    pub fn line(&self) -> String {
        format!(
            "machine during the run: cores busy {:.0} %, idle {:.0} %, stolen by the hypervisor {:.1} %",
            self.busy_pct, self.idle_pct, self.steal_pct
        )
    }
}

/// Cumulative ticks of the `cpu` line: (idle + iowait, steal, total). Fields after `cpu`:
/// user nice system idle iowait irq softirq steal [guest guest_nice] — guest time is already
/// counted in user, so it is left out of the total.
pub fn parse_machine_ticks(proc_stat: &str) -> Option<(u64, u64, u64)> {
    let line = proc_stat.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    if f.len() < 8 {
        return None;
    }
    Some((f[3] + f[4], f[7], f.iter().sum()))
}

/// Measures [`MachineShare`] between `start` and `finish`.
pub struct MachineMeter(Option<(u64, u64, u64)>);

impl MachineMeter {
    fn sample() -> Option<(u64, u64, u64)> {
        parse_machine_ticks(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    pub fn start() -> MachineMeter {
        MachineMeter(Self::sample())
    }

    /// Absent without `/proc/stat` or when no tick passed.
    pub fn finish(self) -> Option<MachineShare> {
        share(self.0?, Self::sample()?)
    }
}

fn share(before: (u64, u64, u64), after: (u64, u64, u64)) -> Option<MachineShare> {
    let idle = after.0.checked_sub(before.0)? as f64;
    let steal = after.1.checked_sub(before.1)? as f64;
    let total = after.2.checked_sub(before.2)? as f64;
    (total > 0.0).then(|| MachineShare {
        busy_pct: 100.0 * (total - idle - steal) / total,
        idle_pct: 100.0 * idle / total,
        steal_pct: 100.0 * steal / total,
    })
}

/// A table cell for an optional figure: three decimals, or `-` when unknown.
pub fn cell(x: Option<f64>) -> String {
    x.map(|v| format!("{v:.3}")).unwrap_or_else(|| "-".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_parser_reads_utime_plus_stime_after_the_last_parenthesis_of_comm() {
        // comm contains spaces and parentheses, and a field after it looks like a number.
        let line = "4242 (nokv (srv) 2) S 1 4242 4242 0 -1 4194560 1234 0 0 0 \
                    250 37 0 0 20 0 9 0 123456 1000000 500 18446744073709551615";
        assert_eq!(parse_stat_ticks(line), Some(250 + 37));
        assert_eq!(parse_stat_ticks("1 (init) S 1 1"), None);
        assert_eq!(parse_stat_ticks("no parenthesis here"), None);
    }

    #[test]
    fn stat_parser_reads_this_processes_own_stat_line() {
        let ticks = CpuClock::of_self().ticks();
        assert!(ticks.is_some(), "/proc/self/stat parses");
    }

    #[test]
    fn cpu_per_op_is_ticks_in_milliseconds_divided_by_operations_and_absent_for_none() {
        // 50 ticks at 100 Hz = 500 ms over 1000 ops = 0.5 ms per op.
        assert_eq!(ms_per_op(50, 100.0, 1000), Some(0.5));
        assert_eq!(ms_per_op(3, 250.0, 6), Some(2.0));
        assert_eq!(ms_per_op(50, 100.0, 0), None);
    }

    #[test]
    fn machine_share_splits_the_interval_into_busy_idle_and_stolen_time() {
        // user nice system idle iowait irq softirq steal guest guest_nice
        let before = "cpu  100 0 50 800 20 0 10 20 7 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n";
        let after = "cpu  190 0 80 1000 40 0 20 70 9 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n";
        let (b, a) = (
            parse_machine_ticks(before).unwrap(),
            parse_machine_ticks(after).unwrap(),
        );
        assert_eq!(b, (820, 20, 1000));
        // 400 ticks passed: 220 idle (incl. iowait), 50 stolen, 130 busy.
        assert_eq!(
            share(b, a),
            Some(MachineShare {
                busy_pct: 32.5,
                idle_pct: 55.0,
                steal_pct: 12.5
            })
        );
        assert_eq!(share(b, b), None, "no tick passed: no share");
        assert_eq!(parse_machine_ticks("cpu0 1 2 3\n"), None);
        assert!(
            MachineMeter::start().0.is_some(),
            "this machine's /proc/stat parses"
        );
    }

    #[test]
    fn pooled_rounds_add_their_ticks_and_an_unknown_round_makes_the_side_unknown() {
        let mut pooled = CpuTicks::default();
        pooled.add(CpuTicks {
            server: Some(30),
            client: Some(4),
        });
        pooled.add(CpuTicks {
            server: Some(20),
            client: None,
        });
        assert_eq!((pooled.server, pooled.client), (Some(50), None));
    }
}
