//! An independent linearizability checker for the histories the black-box tests record.
//!
//! **What is checked.** Each key of a workspace is a register with a server-assigned
//! generation: a write stores a value at a generation strictly greater than every generation
//! the key ever had (generations are never reused, even after a delete); a conditional write
//! or delete succeeds only at the key's current generation; a read returns the current value
//! and generation, or nothing. A history is linearizable if every completed operation can be
//! placed at one instant between its invocation and its response so that the resulting
//! sequence is legal for that register. Operations whose outcome is unknown (the client saw a
//! transport error, or the process was killed) are open-ended: each may take effect at any
//! instant after its invocation, or never.
//!
//! **How.** The Wing–Gong search with Lowe's memoisation (the algorithm Porcupine uses): walk
//! the operations in invocation order; at each step any pending operation invoked before the
//! earliest response among the pending completed ones may be linearized next, if the model
//! accepts it; a (set of linearized operations, model state) pair already explored is not
//! explored again. Keys are independent (linearizability is compositional), so the history is
//! checked one key at a time, which keeps each search small. The checker shares no code with
//! the daemon: it knows only the register semantics above.
//!
//! Values are identified by the writer: every write in a test writes bytes that no other write
//! writes, so a read's bytes name the write it observed (the harness maps them to a
//! [`Value`]). That is also how an unknown write's generation is learned: from a read that
//! observed its value.

use std::collections::{HashMap, HashSet};

/// A value, as the harness numbers them: unique per write. 0 is never a written value.
pub type Value = u64;

/// What a client asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    Read,
    /// Upsert.
    Write {
        value: Value,
    },
    /// Write only if the key's generation is `expected`.
    WriteIf {
        expected: u64,
        value: Value,
    },
    /// Delete; `expected` 0 means unconditional.
    Delete {
        expected: u64,
    },
}

/// What the client heard back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A read: the value and generation, or `None` (NotFound).
    Read(Option<(Value, u64)>),
    /// A write succeeded at this generation.
    Written(u64),
    /// A delete removed this generation.
    Deleted(u64),
    /// A conditional write or delete found another generation (or no file).
    Mismatch,
    /// A delete found nothing.
    NotFound,
    /// No answer: it may have taken effect, or not.
    Unknown,
}

/// One operation of a history: its key, call, outcome and the instants (any monotonic unit)
/// of its invocation and response. An unknown outcome's response instant is ignored.
#[derive(Clone, Debug)]
pub struct Op {
    pub key: String,
    pub call: Call,
    pub outcome: Outcome,
    pub invoked: u64,
    pub answered: u64,
}

/// The register's state in the sequential model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
struct Register {
    /// The current value and its generation; the generation is `None` for a value written by
    /// an operation with an unknown outcome that no read observed.
    current: Option<(Value, Option<u64>)>,
    /// The highest generation known to have been assigned.
    highest: u64,
}

impl Register {
    /// The state after `call` answered `outcome`, if the model allows that answer here.
    /// `learned` gives the generation a read observed for a value written with an unknown
    /// outcome.
    fn step(self, call: Call, outcome: Outcome, learned: &HashMap<Value, u64>) -> Option<Self> {
        // Could the current value's generation be `e`? A value written by an unknown outcome
        // that no read observed has some generation above every one known before it: an
        // answer that names one (a delete's, a conditional write's) may reveal it.
        let could_be = |e: u64| match self.current {
            None => false,
            Some((_, Some(g))) => g == e,
            Some((_, None)) => e > self.highest,
        };
        let known_other_than = |e: u64| !matches!(self.current, Some((_, Some(g))) if g == e);
        // The current value's generation is `e` (possibly learned just now).
        let revealed = |e: u64| Register {
            current: self.current.map(|(v, _)| (v, Some(e))),
            highest: self.highest.max(e),
        };
        let gone = |e: u64| Register {
            current: None,
            highest: self.highest.max(e),
        };
        match (call, outcome) {
            (Call::Read, Outcome::Read(seen)) => {
                let now = self
                    .current
                    .map(|(v, g)| (v, g.or(learned.get(&v).copied())));
                match (now, seen) {
                    (None, None) => Some(self),
                    (Some((v, g)), Some((sv, sg))) if v == sv && g.is_none_or(|g| g == sg) => {
                        Some(self)
                    }
                    _ => None,
                }
            }
            (Call::Write { value }, Outcome::Written(g)) => self.write(value, Some(g)),
            (Call::Write { value }, Outcome::Unknown) => {
                self.write(value, learned.get(&value).copied())
            }
            (Call::WriteIf { expected, value }, Outcome::Written(g)) => {
                could_be(expected).then_some(())?;
                revealed(expected).write(value, Some(g))
            }
            (Call::WriteIf { expected, value }, Outcome::Unknown) => {
                could_be(expected).then_some(())?;
                revealed(expected).write(value, learned.get(&value).copied())
            }
            (Call::WriteIf { expected, .. }, Outcome::Mismatch | Outcome::NotFound) => {
                known_other_than(expected).then_some(self)
            }
            (Call::Delete { expected }, Outcome::Deleted(g)) => {
                (could_be(g) && (expected == 0 || expected == g)).then_some(gone(g))
            }
            (Call::Delete { expected }, Outcome::Unknown) => match expected {
                0 => self.current.is_some().then_some(gone(0)),
                e => could_be(e).then_some(gone(e)),
            },
            (Call::Delete { .. }, Outcome::NotFound) => self.current.is_none().then_some(self),
            (Call::Delete { expected }, Outcome::Mismatch) => {
                (expected != 0 && known_other_than(expected)).then_some(self)
            }
            _ => None,
        }
    }

    /// `value` stored at generation `g` (`None`: unknown), which must exceed every
    /// generation the key had.
    fn write(self, value: Value, g: Option<u64>) -> Option<Self> {
        if let Some(g) = g
            && g <= self.highest
        {
            return None;
        }
        Some(Register {
            current: Some((value, g)),
            highest: g.unwrap_or(self.highest),
        })
    }
}

/// Why a key's history is not linearizable.
#[derive(Debug)]
pub struct Violation {
    pub key: String,
    /// The key's operations (completed ones, and unknown ones that may have taken effect).
    pub ops: Vec<Op>,
    /// The longest prefix of a legal order the search found.
    pub longest_prefix: Vec<Op>,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "key {:?}: {} operations are not linearizable; the longest legal order found \
             ({} ops) ends with:",
            self.key,
            self.ops.len(),
            self.longest_prefix.len()
        )?;
        for op in self.longest_prefix.iter().rev().take(5).rev() {
            writeln!(f, "  {op:?}")?;
        }
        writeln!(f, "operations:")?;
        for op in self.ops.iter().take(40) {
            writeln!(f, "  {op:?}")?;
        }
        Ok(())
    }
}

/// What a check looked at.
#[derive(Debug, Default, Clone, Copy)]
pub struct Checked {
    pub keys: usize,
    pub operations: usize,
    /// The most (linearized set, state) pairs one key's search remembered: its memory bound.
    pub largest_memo: usize,
}

/// Checks `history` key by key. Reads with an unknown outcome are dropped first (they change
/// nothing and promise nothing).
pub fn check(history: &[Op]) -> Result<Checked, Box<Violation>> {
    let mut by_key: HashMap<&str, Vec<Op>> = HashMap::new();
    for op in history {
        if op.call == Call::Read && op.outcome == Outcome::Unknown {
            continue;
        }
        by_key.entry(&op.key).or_default().push(op.clone());
    }
    let mut checked = Checked::default();
    let mut keys: Vec<_> = by_key.into_iter().collect();
    keys.sort_by(|a, b| a.0.cmp(b.0));
    for (key, ops) in keys {
        checked.keys += 1;
        checked.operations += ops.len();
        let memo = check_key(key, ops)?;
        checked.largest_memo = checked.largest_memo.max(memo);
    }
    Ok(checked)
}

/// One key's search; returns how many states it remembered.
fn check_key(key: &str, mut ops: Vec<Op>) -> Result<usize, Box<Violation>> {
    ops.sort_by_key(|o| o.invoked);
    let n = ops.len();
    let learned: HashMap<Value, u64> = ops
        .iter()
        .filter_map(|o| match o.outcome {
            Outcome::Read(Some((v, g))) => Some((v, g)),
            _ => None,
        })
        .collect();
    let answered = |o: &Op| {
        if o.outcome == Outcome::Unknown {
            u64::MAX
        } else {
            o.answered
        }
    };
    let completed: Vec<usize> = (0..n)
        .filter(|&i| ops[i].outcome != Outcome::Unknown)
        .collect();

    let words = n.div_ceil(64);
    let mut seen: HashSet<(Vec<u64>, Register)> = HashSet::new();
    // The search: each frame is a linearized set, the state it leads to, and the next
    // candidate to try from it.
    let mut stack: Vec<(Vec<u64>, Register, usize, Vec<usize>)> =
        vec![(vec![0; words], Register::default(), 0, Vec::new())];
    let mut longest: Vec<usize> = Vec::new();
    let done = |set: &[u64]| {
        completed
            .iter()
            .all(|&i| set[i / 64] & (1 << (i % 64)) != 0)
    };
    while let Some((set, state, next, order)) = stack.pop() {
        if done(&set) {
            return Ok(seen.len());
        }
        if order.len() > longest.len() {
            longest = order.clone();
        }
        // Every candidate must be invoked before the earliest response of the pending
        // completed operations (else that one must come first).
        let horizon = (0..n)
            .filter(|&i| set[i / 64] & (1 << (i % 64)) == 0)
            .map(|i| answered(&ops[i]))
            .min()
            .unwrap_or(u64::MAX);
        let mut i = next;
        while i < n && ops[i].invoked <= horizon {
            if set[i / 64] & (1 << (i % 64)) == 0
                && let Some(after) = state.step(ops[i].call, ops[i].outcome, &learned)
            {
                let mut grown = set.clone();
                grown[i / 64] |= 1 << (i % 64);
                if seen.insert((grown.clone(), after)) {
                    // Resume this frame at the next candidate after exploring this one.
                    stack.push((set.clone(), state, i + 1, order.clone()));
                    let mut deeper = order.clone();
                    deeper.push(i);
                    stack.push((grown, after, 0, deeper));
                    break;
                }
            }
            i += 1;
        }
    }
    Err(Box::new(Violation {
        key: key.to_string(),
        longest_prefix: longest.iter().map(|&i| ops[i].clone()).collect(),
        ops,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(call: Call, outcome: Outcome, invoked: u64, answered: u64) -> Op {
        Op {
            key: "k".into(),
            call,
            outcome,
            invoked,
            answered,
        }
    }

    fn w(value: Value, g: u64, t: (u64, u64)) -> Op {
        op(Call::Write { value }, Outcome::Written(g), t.0, t.1)
    }

    fn r(seen: Option<(Value, u64)>, t: (u64, u64)) -> Op {
        op(Call::Read, Outcome::Read(seen), t.0, t.1)
    }

    #[test]
    fn a_sequential_history_of_writes_reads_and_a_delete_is_linearizable() {
        let h = vec![
            r(None, (0, 1)),
            w(1, 1, (2, 3)),
            r(Some((1, 1)), (4, 5)),
            w(2, 2, (6, 7)),
            op(Call::Delete { expected: 2 }, Outcome::Deleted(2), 8, 9),
            r(None, (10, 11)),
            w(3, 3, (12, 13)),
        ];
        let c = check(&h).unwrap();
        assert_eq!((c.keys, c.operations), (1, 7));
    }

    #[test]
    fn a_stale_read_after_a_newer_write_was_acknowledged_is_rejected() {
        // Write 1 and then write 2 are both acknowledged before the read starts; the read
        // returns 1: no order places it after write 2.
        let h = vec![w(1, 1, (0, 1)), w(2, 2, (2, 3)), r(Some((1, 1)), (4, 5))];
        let v = check(&h).unwrap_err();
        assert_eq!(v.key, "k");
        assert!(v.to_string().contains("not linearizable"), "{v}");
    }

    #[test]
    fn a_read_concurrent_with_a_write_may_see_either_value() {
        let old = vec![w(1, 1, (0, 1)), w(2, 2, (2, 10)), r(Some((1, 1)), (3, 4))];
        let new = vec![w(1, 1, (0, 1)), w(2, 2, (2, 10)), r(Some((2, 2)), (3, 4))];
        check(&old).unwrap();
        check(&new).unwrap();
    }

    #[test]
    fn two_reads_that_see_new_then_old_while_one_write_is_in_flight_are_rejected() {
        // Once a read returned the new value, a later read may not return the old one.
        let h = vec![
            w(1, 1, (0, 1)),
            w(2, 2, (2, 20)),
            r(Some((2, 2)), (3, 4)),
            r(Some((1, 1)), (5, 6)),
        ];
        check(&h).unwrap_err();
    }

    #[test]
    fn a_generation_reused_after_a_delete_is_rejected() {
        let h = vec![
            w(1, 5, (0, 1)),
            op(Call::Delete { expected: 0 }, Outcome::Deleted(5), 2, 3),
            w(2, 5, (4, 5)),
        ];
        check(&h).unwrap_err();
    }

    #[test]
    fn a_write_with_an_unknown_outcome_may_take_effect_later_or_never() {
        // Observed later by a read: it took effect (its generation learned from the read).
        let took = vec![
            w(1, 1, (0, 1)),
            op(Call::Write { value: 2 }, Outcome::Unknown, 2, 3),
            r(Some((1, 1)), (4, 5)),
            r(Some((2, 2)), (6, 7)),
        ];
        check(&took).unwrap();
        // Never observed: it may never have happened.
        let never = vec![
            w(1, 1, (0, 1)),
            op(Call::Write { value: 2 }, Outcome::Unknown, 2, 3),
            r(Some((1, 1)), (40, 50)),
        ];
        check(&never).unwrap();
        // But it cannot take effect before it was invoked.
        let early = vec![
            w(1, 1, (0, 1)),
            r(Some((2, 2)), (2, 3)),
            op(Call::Write { value: 2 }, Outcome::Unknown, 4, 5),
        ];
        check(&early).unwrap_err();
    }

    #[test]
    fn a_delete_or_conditional_write_after_an_unknown_write_reveals_its_generation() {
        // The write's answer was lost (a kill); after the restart a delete removes it at
        // generation 2 — the only place that generation is ever seen.
        let deleted = vec![
            w(1, 1, (0, 1)),
            op(Call::Write { value: 2 }, Outcome::Unknown, 2, 3),
            op(Call::Delete { expected: 0 }, Outcome::Deleted(2), 10, 11),
            w(3, 3, (12, 13)),
        ];
        check(&deleted).unwrap();
        // A revealed generation still cannot be one the key already had.
        let reused = vec![
            w(1, 5, (0, 1)),
            op(Call::Write { value: 2 }, Outcome::Unknown, 2, 3),
            op(Call::Delete { expected: 0 }, Outcome::Deleted(4), 10, 11),
        ];
        check(&reused).unwrap_err();
        let conditional = vec![
            w(1, 1, (0, 1)),
            op(Call::Write { value: 2 }, Outcome::Unknown, 2, 3),
            op(
                Call::WriteIf {
                    expected: 2,
                    value: 3,
                },
                Outcome::Written(3),
                10,
                11,
            ),
            r(Some((3, 3)), (12, 13)),
        ];
        check(&conditional).unwrap();
    }

    #[test]
    fn a_conditional_write_succeeds_only_at_the_current_generation() {
        let ok = vec![
            w(1, 1, (0, 1)),
            op(
                Call::WriteIf {
                    expected: 1,
                    value: 2,
                },
                Outcome::Written(2),
                2,
                3,
            ),
            op(
                Call::WriteIf {
                    expected: 1,
                    value: 3,
                },
                Outcome::Mismatch,
                4,
                5,
            ),
        ];
        check(&ok).unwrap();
        // Two conditional writes on the same generation cannot both succeed.
        let both = vec![
            w(1, 1, (0, 1)),
            op(
                Call::WriteIf {
                    expected: 1,
                    value: 2,
                },
                Outcome::Written(2),
                2,
                10,
            ),
            op(
                Call::WriteIf {
                    expected: 1,
                    value: 3,
                },
                Outcome::Written(3),
                2,
                10,
            ),
        ];
        check(&both).unwrap_err();
    }

    #[test]
    fn a_long_concurrent_history_is_checked_with_bounded_memory() {
        // Eight clients, 2,000 writes and reads on one key, each read seeing the write that
        // completed just before it: legal, and the memo stays far below the 2^n worst case.
        let mut h = Vec::new();
        let mut t = 0;
        for i in 1..=1000u64 {
            h.push(w(i, i, (t, t + 3)));
            h.push(r(Some((i, i)), (t + 1, t + 5)));
            t += 4;
        }
        let c = check(&h).unwrap();
        assert_eq!(c.operations, 2000);
        assert!(c.largest_memo < 100_000, "{c:?}");
    }
}
