//! The byte layout of a channel segment, shared by every process that maps it.
//!
//! Every field other processes may touch is an atomic (or the pthread mutex),
//! so shared references into the mapping are sound. Offsets are relative to
//! the segment base because each process maps it at its own address.
//!
//! ```text
//! Header (4 KiB)    magic, version, geometry, closed flag, the robust mutex,
//!                   allocator state (block count, bump pointer, free lists),
//!                   the "space freed" futex
//! Lane[max_lanes]   key, head/tail positions, not-empty / not-full futexes
//! Slot[max_lanes * lane_capacity]   descriptor rings, one per lane
//! BlockMeta[max_blocks]             one entry per carved arena block
//! Arena             payload blocks, page aligned
//! ```

use std::cell::UnsafeCell;
use std::mem::size_of;
use std::sync::atomic::{AtomicU32, AtomicU64};

/// Segment magic: "RLCHAN01" as little-endian bytes.
pub const MAGIC: u64 = u64::from_le_bytes(*b"RLCHAN01");
/// Bumped on any change to the structs in this file.
pub const LAYOUT_VERSION: u32 = 3;
/// Longest lane key, in bytes.
pub const KEY_MAX: usize = 120;
/// Number of arena size classes (see [`class_size`]).
pub const NUM_CLASSES: usize = 110;
/// "No block" marker in free lists.
pub const NONE: u32 = u32::MAX;
/// Page size assumed for alignment (x86-64 and aarch64 Linux default).
pub const PAGE: u64 = 4096;

/// Slot states (the descriptor ring's per-item state machine).
pub mod slot_state {
    /// Unused.
    pub const EMPTY: u32 = 0;
    /// Claimed by a producer that is still writing the payload.
    pub const RESERVED: u32 = 1;
    /// Published: the payload is complete.
    pub const READY: u32 = 2;
    /// The producer died before publishing; consumers skip it.
    pub const TOMBSTONE: u32 = 3;
}

/// Who keeps a segment's name: [`Header::owner`].
pub mod owner {
    /// Its holders: the last process to let go of the segment removes the name.
    pub const HOLDERS: u32 = 0;
    /// The creating process (`creator_pid`, `creator_start`) while it runs,
    /// whether or not it still holds the segment; after that, its holders.
    pub const CREATOR: u32 = 1;
    /// The creator gave the name up (it released its channels or is
    /// exiting): its holders again.
    pub const RELEASED: u32 = 2;
}

/// Block states.
pub mod block_state {
    /// On a free list (or at the bump frontier).
    pub const FREE: u32 = 0;
    /// Owned by a producer that is filling it.
    pub const WRITING: u32 = 1;
    /// Referenced by a published slot.
    pub const QUEUED: u32 = 2;
    /// Handed to a consumer, which holds it until its views are dropped.
    pub const LEASED: u32 = 3;
}

/// A futex word with a count of sleepers, on its own cache lines.
#[repr(C, align(128))]
pub struct WaitWord {
    /// Bumped by every event; sleepers wait for it to change.
    pub seq: AtomicU32,
    /// Number of processes sleeping (or about to) on `seq`.
    pub waiters: AtomicU32,
    /// CPU (plus one; 0 = unknown) the last notifier ran on: a waiter on the
    /// same CPU does not spin, it would only delay that notifier.
    pub last_cpu: AtomicU32,
}

/// Segment header. Allocator fields are only touched under `mutex`.
#[repr(C, align(4096))]
pub struct Header {
    pub magic: AtomicU64,
    pub layout_version: AtomicU32,
    pub header_size: AtomicU32,
    pub total_size: AtomicU64,
    pub max_lanes: AtomicU32,
    pub lane_capacity: AtomicU32,
    pub max_blocks: AtomicU32,
    pub creator_pid: AtomicU32,
    pub lanes_off: AtomicU64,
    pub slots_off: AtomicU64,
    pub blocks_off: AtomicU64,
    pub arena_off: AtomicU64,
    pub arena_size: AtomicU64,
    /// Non-zero once `close()` was called.
    pub closed: AtomicU32,
    /// Caller-defined number (the Python layer stores `maxsize` here).
    pub user_tag: AtomicU32,
    /// Process-shared, robust pthread mutex guarding the allocator and lane positions.
    pub mutex: MutexCell,
    /// Number of carved blocks (entries `0..n_blocks` of the block table are valid).
    pub n_blocks: AtomicU32,
    pub _pad0: AtomicU32,
    /// First arena byte not yet carved into a block.
    pub arena_bump: AtomicU64,
    /// Head of each size class's free list (block index or [`NONE`]).
    pub free_heads: [AtomicU32; NUM_CLASSES],
    /// Bumped when a block is freed: producers waiting for arena space sleep here.
    pub space: WaitWord,
    /// Start time of the creating process (with `creator_pid`, its identity).
    pub creator_start: AtomicU64,
    /// Who keeps the name (see [`owner`]).
    pub owner: AtomicU32,
}

/// The pthread mutex, in its own aligned cell.
#[repr(C, align(64))]
pub struct MutexCell(pub UnsafeCell<libc::pthread_mutex_t>);

// SAFETY: the mutex is process-shared and only ever used through the pthread
// API, which is thread-safe; we never form references to its interior.
unsafe impl Sync for MutexCell {}

/// One lane: a FIFO of descriptors for one key.
#[repr(C, align(128))]
pub struct Lane {
    /// 0 = free, 1 = in use (set last when a lane is created).
    pub in_use: AtomicU32,
    pub key_len: AtomicU32,
    pub key_hash: AtomicU64,
    /// Next position to take (consumer side).
    pub head: AtomicU64,
    /// Next position to reserve (producer side).
    pub tail: AtomicU64,
    /// Key bytes, packed little-endian into words.
    pub key: [AtomicU64; KEY_MAX / 8],
    pub not_empty: WaitWord,
    pub not_full: WaitWord,
}

/// One ring slot: a descriptor of a message.
#[repr(C)]
pub struct Slot {
    pub state: AtomicU32,
    pub block: AtomicU32,
    pub generation: AtomicU32,
    pub _pad: AtomicU32,
    pub weight: AtomicU64,
    pub len: AtomicU64,
}

/// Metadata of one arena block.
#[repr(C, align(64))]
pub struct BlockMeta {
    pub off: AtomicU64,
    pub cap: AtomicU64,
    pub state: AtomicU32,
    pub generation: AtomicU32,
    pub class: AtomicU32,
    pub next_free: AtomicU32,
    pub owner_pid: AtomicU32,
    pub _pad: AtomicU32,
    pub owner_start: AtomicU64,
}

/// Where each table lives, computed from the channel's geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub max_lanes: u32,
    pub lane_capacity: u32,
    pub max_blocks: u32,
    pub arena_size: u64,
    pub lanes_off: u64,
    pub slots_off: u64,
    pub blocks_off: u64,
    pub arena_off: u64,
    pub total_size: u64,
}

/// `x` rounded up to a multiple of `a`; `None` when that overflows (sizes
/// come from peers and from segment headers, so they may be near `u64::MAX`).
const fn align_up(x: u64, a: u64) -> Option<u64> {
    x.div_ceil(a).checked_mul(a)
}

impl Geometry {
    /// Lays out a segment; `None` when the numbers overflow.
    pub fn new(
        max_lanes: u32,
        lane_capacity: u32,
        max_blocks: u32,
        arena_size: u64,
    ) -> Option<Self> {
        let lanes_off = align_up(size_of::<Header>() as u64, PAGE)?;
        let lanes_bytes = (max_lanes as u64).checked_mul(size_of::<Lane>() as u64)?;
        let slots_off = align_up(lanes_off.checked_add(lanes_bytes)?, PAGE)?;
        let n_slots = (max_lanes as u64).checked_mul(lane_capacity as u64)?;
        let slots_bytes = n_slots.checked_mul(size_of::<Slot>() as u64)?;
        let blocks_off = align_up(slots_off.checked_add(slots_bytes)?, PAGE)?;
        let blocks_bytes = (max_blocks as u64).checked_mul(size_of::<BlockMeta>() as u64)?;
        let arena_off = align_up(blocks_off.checked_add(blocks_bytes)?, PAGE)?;
        let arena_size = align_up(arena_size, PAGE)?;
        let total_size = arena_off.checked_add(arena_size)?;
        Some(Self {
            max_lanes,
            lane_capacity,
            max_blocks,
            arena_size,
            lanes_off,
            slots_off,
            blocks_off,
            arena_off,
            total_size,
        })
    }
}

/// Size in bytes of size class `c`: 4 KiB, 8 KiB, then four steps per
/// power of two from 16 KiB (16, 20, 24, 28, 32, 40, ... KiB), so a block
/// wastes at most 25% of its size. All sizes are page multiples.
pub const fn class_size(c: usize) -> u64 {
    if c < 2 {
        4096 << c
    } else {
        let k = 14 + (c - 2) / 4;
        let i = ((c - 2) % 4) as u64;
        (1u64 << k) + i * (1u64 << (k - 2))
    }
}

/// Smallest class whose blocks hold `size` bytes, or `None` if none does.
pub fn class_for(size: u64) -> Option<usize> {
    (0..NUM_CLASSES).find(|&c| class_size(c) >= size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_increasing_page_multiples_with_bounded_waste() {
        for c in 1..NUM_CLASSES {
            assert!(class_size(c) > class_size(c - 1));
            assert_eq!(class_size(c) % PAGE, 0);
            assert!(class_size(c) as f64 <= class_size(c - 1) as f64 * 2.0);
            if c > 2 {
                assert!(class_size(c) as f64 / class_size(c - 1) as f64 <= 1.25 + 1e-9);
            }
        }
        assert_eq!(class_for(1), Some(0));
        assert_eq!(class_for(4097), Some(1));
        assert_eq!(class_for(64 << 20), Some(class_for(64 << 20).unwrap()));
        assert_eq!(class_size(class_for(64 << 20).unwrap()), 64 << 20);
        assert!(class_size(NUM_CLASSES - 1) >= 1 << 40);
    }

    #[test]
    fn geometry_refuses_sizes_whose_page_rounding_overflows() {
        for arena in [u64::MAX, u64::MAX - (PAGE - 2)] {
            assert_eq!(Geometry::new(1, 1, 1, arena), None, "arena {arena}");
        }
    }

    #[test]
    fn geometry_is_page_aligned_and_ordered() {
        let g = Geometry::new(8, 1024, 4096, 1 << 30).unwrap();
        for off in [g.lanes_off, g.slots_off, g.blocks_off, g.arena_off] {
            assert_eq!(off % PAGE, 0);
        }
        assert!(
            g.lanes_off < g.slots_off && g.slots_off < g.blocks_off && g.blocks_off < g.arena_off
        );
        assert_eq!(g.total_size, g.arena_off + (1 << 30));
        assert!(Geometry::new(u32::MAX, u32::MAX, u32::MAX, u64::MAX).is_none());
    }

    #[test]
    fn struct_sizes_are_stable() {
        assert_eq!(size_of::<Header>(), 4096);
        assert_eq!(size_of::<Slot>(), 32);
        assert_eq!(size_of::<BlockMeta>(), 64);
        assert_eq!(size_of::<WaitWord>(), 128);
    }
}
