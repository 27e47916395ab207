//! The durability of a metadata store: how a batch becomes durable without redb's fsync (the
//! redo log in front of the store), and how opening the store gets every such batch back.
//!
//! A durable redb commit writes back every page the batch touched (5–6 scattered pages per
//! small write) and fsyncs the file, and while it does the single writer can run nothing else.
//! So the committer commits a batch with `Durability::None` (atomic and visible to later
//! sessions, not durable) — or holds the transaction open for the next batches and commits it
//! once (readers see held batches through [`super::overlay`], built from these records) — and
//! appends the batch's **row effects** — every insert and remove its
//! sessions made, in order, as captured by [`super::undo::UndoTable`] — to this log as one
//! record; a second thread appends and fsyncs records while the committer already runs the next
//! batch, and only then are the batch's sessions answered or shown to readers. Every second or
//! so the committer makes the file itself durable and starts a new **round** of the log
//! ([`super::MetaStore::checkpoint`]).
//!
//! **Invariant (what a crash leaves):** the durable state is redb's last durable commit plus
//! every record of the log's current round whose sequence number is above the `applied`
//! sequence that commit holds, applied in log order. Hence:
//! * every batch writes its own sequence number as `applied` in the transaction it runs in
//!   (held across batches or not), so a durable commit says exactly which batches it already
//!   contains (records at or below it are skipped on replay, never applied twice);
//! * records are appended in commit order and a batch is acknowledged only after its record
//!   (and every record before it) was fsynced — a crash keeps a prefix of the batches, never a
//!   later one without an earlier one;
//! * every write that is not a batch (preparing a namespace, a load's import, a checkpoint's
//!   flush) is a durable redb commit, so the log never needs to describe it;
//! * after a failed append nothing more is appended through that handle; after a failed
//!   *fsync* nothing more is done by the process at all (see [`super::fatal`]).
//!
//! **Rounds: the log is checked against the file, never trusted blindly.** Each round has a
//! random 64-bit id and starts with a durable commit that records it (with the sequence it
//! starts at and the id of the round before it) in the node file. The log of a round begins,
//! at offset 0, with a *marker* naming the round and its start, written (and fsynced) right
//! after that commit and before any record of the round; every record's checksum mixes in
//! the round id. So, at open, the file says exactly what the log must hold, and
//! [`scan`] refuses — naming the file, the offset and the sequence numbers — whatever does not
//! fit: a missing or emptied log, one from another round or another moment (a hand-made backup
//! of one of the two files), damage followed by records that were written after it. Stale
//! bytes behind the tail (earlier rounds, zeros, user file bodies) can never pass for a record
//! of this round, and the log is read in bounded memory, one record at a time.
//!
//! A record is `magic, payload length, sequence, first sequence of its append, checksum`, then
//! the payload; a marker is the same header with its own magic, no payload, and the round's
//! start as both sequences. Files written before rounds existed (no round in the node file)
//! are read once with the old rules, replayed, and moved to a fresh round.
//!
//! **One home for the ordering rules.** Everything that orders the log against the node file
//! lives here, one concept a file:
//! * [`journal`]: the [`Journal`] of a store handle — the batch sequence, the appending end, the
//!   round a checkpoint begins — and the store's `log` (append) and `checkpoint`;
//! * [`replay`]: the restart — bringing the file up to date with its log when the store opens,
//!   and beginning a new round;
//! * [`latch`]: the failure latch that stops every write of a handle after a storage error (and
//!   turns a failed fsync into the end of the process, see [`super::fatal`]);
//! * [`batch`]: the committer's sessions in one transaction, each batch taking the next sequence
//!   number and ending as one [`Redo`] record;
//! * [`record`]: a record's row effects, [`format`]: their framing on disk, [`round`]: what the
//!   node file says about the log, [`log`]: the appending end of the file, [`scan`]: reading it
//!   back at open, and [`salvage`]: starting again from a damaged log when the operator accepts
//!   the loss.

mod batch;
mod format;
mod journal;
mod latch;
mod log;
mod record;
mod replay;
mod round;
mod salvage;
mod scan;

#[cfg(test)]
pub(super) use batch::HOLD_BATCHES;
pub use batch::{Batch, Logged};
pub(super) use journal::Journal;
pub(super) use latch::fatal_if_synced_failed;
pub use record::Redo;
pub(super) use record::{Effects, apply_in};
pub use salvage::Salvage;

#[cfg(test)]
mod tests;
