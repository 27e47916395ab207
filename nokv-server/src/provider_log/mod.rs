//! The node's redo log in the object provider (`--metadata-durability provider`, issue 45):
//! the durability tier that lets another node take a crashed node's shards without losing an
//! acknowledged write, and a node be rebuilt on an empty disk from the bucket.
//!
//! Each node writes its redo records, in node-wide sequence order, as segments of one stream
//! per incarnation ([`stream`]); a segment's bytes are [`segment`]. A node that takes a shard
//! whose owner's lease lapsed fences the owner's stream with a create-if-absent at the
//! sequence after its highest contiguous one, then replays the shard's records up to the fence.
//! The fence is safe without clocks: the old owner's next segment needs that same key, and the
//! provider lets one of them create it.

pub mod segment;
pub mod stream;
pub mod writer;

pub use segment::{Kind, Segment, SegmentError};
pub use stream::{LogError, StreamId, Tail};
pub use writer::{IDLE_LAG, LogWriter, Outgoing, Prepared, WriteError, WriterStats};

#[cfg(test)]
mod tests;
