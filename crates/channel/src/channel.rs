//! The shared-memory channel: keyed FIFO lanes of descriptors over a block arena.
//!
//! Concurrency model (see the crate README for the reasoning):
//! - Short metadata sections (reserve a slot and a block, take a slot, free a
//!   block, create a lane) run under one process-shared **robust** mutex. If a
//!   holder dies, the next locker is told so and runs [`Inner::repair_locked`],
//!   which rebuilds every derived structure from the primary state. Every
//!   section is ordered so that it has a single commit store.
//! - Payload copies run outside the lock: a producer reserves a slot
//!   (`RESERVED`) and a block (`WRITING`), copies, then publishes with one
//!   atomic store (`READY`). A producer killed in between leaves a `RESERVED`
//!   slot whose block owner is dead; the next liveness pass turns it into a
//!   `TOMBSTONE` that consumers skip, so nothing torn is ever delivered.
//! - Consumers lease blocks (`LEASED`, owner = their pid); a lease ends when
//!   its last [`Lease`] handle drops, or when a liveness pass finds the owner
//!   dead.
//! - Waiting: optional brief spin, then a shared futex with a waiter count,
//!   always in slices of at most [`WAIT_SLICE`], after which closed flags,
//!   deadlines and peer liveness are re-checked.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::mem::size_of;
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release, SeqCst};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

pub use crate::encoding::{MessageLayout, Piece, message_pieces, message_size, parse_message};
use crate::encoding::{key_from_words, key_hash, key_words, write_message};
use crate::layout::{
    BlockMeta, Geometry, Header, KEY_MAX, LAYOUT_VERSION, Lane, MAGIC, NONE, NUM_CLASSES, Slot,
    WaitWord, block_state, class_for, class_size, owner, slot_state,
};
use crate::naming::{NameError, segment_name};
use crate::spin;
use crate::sys;

/// Longest time one futex sleep lasts before conditions are re-checked.
pub const WAIT_SLICE: Duration = Duration::from_millis(100);
/// Longest time we wait for the channel mutex.
const LOCK_TIMEOUT: Duration = Duration::from_secs(10);
/// Segments younger than this are never removed by the janitor (creation race).
const JANITOR_GRACE: Duration = Duration::from_secs(5);
/// Upper bounds accepted from a segment header (it is untrusted input).
const MAX_LANES_LIMIT: u32 = 1 << 16;
const MAX_CAPACITY_LIMIT: u32 = 1 << 24;
const MAX_BLOCKS_LIMIT: u32 = 1 << 24;

/// Everything that can go wrong on a channel.
#[derive(Debug)]
pub enum ChannelError {
    /// The channel was closed.
    Closed,
    /// Non-blocking put on a full lane (or a full arena).
    Full,
    /// Non-blocking get on an empty lane.
    Empty,
    /// A blocking call ran past its timeout.
    Timeout,
    /// A segment with this name exists already.
    Exists(String),
    /// No segment with this name exists.
    NotFound(String),
    /// Bad channel or namespace name.
    Name(NameError),
    /// Bad argument (message says which and why).
    Invalid(String),
    /// The segment failed validation.
    Corrupt(String),
    /// An OS call failed.
    Io(io::Error),
}

impl fmt::Display for ChannelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChannelError::Closed => write!(f, "channel is closed"),
            ChannelError::Full => write!(f, "channel lane is full"),
            ChannelError::Empty => write!(f, "channel lane is empty"),
            ChannelError::Timeout => write!(f, "timed out waiting on the channel"),
            ChannelError::Exists(n) => {
                write!(
                    f,
                    "channel segment {n:?} already exists; connect to it instead of creating it"
                )
            }
            ChannelError::NotFound(n) => write!(
                f,
                "no channel segment {n:?}: create the channel first (or check its name and namespace)"
            ),
            ChannelError::Name(e) => write!(f, "{e}"),
            ChannelError::Invalid(m) => write!(f, "{m}"),
            ChannelError::Corrupt(m) => write!(f, "channel segment is corrupt: {m}"),
            ChannelError::Io(e) => write!(f, "channel I/O error: {e}"),
        }
    }
}

impl std::error::Error for ChannelError {}

impl From<io::Error> for ChannelError {
    fn from(e: io::Error) -> Self {
        if e.kind() == io::ErrorKind::TimedOut {
            ChannelError::Corrupt(e.to_string())
        } else {
            ChannelError::Io(e)
        }
    }
}

impl From<NameError> for ChannelError {
    fn from(e: NameError) -> Self {
        ChannelError::Name(e)
    }
}

/// Every channel handle of this process, for [`release_all_names`].
static OPEN_CHANNELS: Mutex<Vec<Weak<Inner>>> = Mutex::new(Vec::new());

/// Segments this process created with [`Channel::create_owned`], for
/// [`release_owned_names`].
static OWNED_NAMES: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn register(inner: Inner) -> Channel {
    let inner = Arc::new(inner);
    if let Ok(mut open) = OPEN_CHANNELS.lock() {
        open.retain(|w| w.strong_count() > 0);
        open.push(Arc::downgrade(&inner));
    }
    Channel { inner }
}

/// Called at interpreter exit (and by a worker at teardown): gives up the
/// names this process created ([`release_owned_names`]), then, for every
/// segment this process still maps, drops our locks and unlinks the name if
/// no other process holds it and no live creator keeps it. (Objects alive at
/// exit are not always destroyed, so `Drop` cannot be relied on to clean up.)
/// Returns the number of names removed.
pub fn release_all_names() -> usize {
    let mut removed = release_owned_names(None);
    let me = std::process::id();
    let inners: Vec<Arc<Inner>> = match OPEN_CHANNELS.lock() {
        // Handles inherited over fork() share their locks with the parent.
        Ok(open) => open
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|i| i.opener.0 == me)
            .collect(),
        Err(_) => return removed,
    };
    let mut names: Vec<&str> = inners.iter().map(|i| i.seg_name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    for name in names {
        let group: Vec<&Arc<Inner>> = inners.iter().filter(|i| i.seg_name == name).collect();
        for inner in &group {
            let _ = sys::unlock(&inner.fd);
        }
        if let Some(first) = group.first() {
            if remove_if_last(&first.fd, name, || claimed_by_creator(first.header())) {
                removed += 1;
            }
        }
    }
    removed
}

/// Gives up the names of the segments this process created with
/// [`Channel::create_owned`] (those of `namespace`, or all): each name is
/// removed now if no process holds its segment, else when the last holder
/// lets go. Segments under those names that another process created (after
/// ours were unlinked) are left alone. Returns the number of names removed now.
pub fn release_owned_names(namespace: Option<&str>) -> usize {
    let names: Vec<String> = match OWNED_NAMES.lock() {
        Ok(mut owned) => {
            let (mine, kept) = owned.drain(..).partition(|n: &String| {
                namespace.is_none_or(|want| {
                    crate::naming::parse_segment_name(n).is_some_and(|(ns, _)| ns == want)
                })
            });
            *owned = kept;
            mine
        }
        Err(_) => return 0,
    };
    names.iter().filter(|name| release_owned(name)).count()
}

/// Ends this process's claim on segment `name` (if the segment there is one
/// it created) and removes the name if nobody holds the segment.
fn release_owned(name: &str) -> bool {
    let Ok(fd) = sys::shm_open_existing(name) else {
        return false; // unlinked already
    };
    let Some(map) = map_header(&fd) else {
        return false;
    };
    let h = header_at(&map);
    let ours = valid_magic_and_version(h)
        && (h.creator_pid.load(Relaxed), h.creator_start.load(Relaxed)) == sys::self_identity();
    if !ours
        || h.owner
            .compare_exchange(owner::CREATOR, owner::RELEASED, SeqCst, SeqCst)
            .is_err()
    {
        return false;
    }
    remove_if_last(&fd, name, || claimed_by_creator(h))
}

fn valid_magic_and_version(h: &Header) -> bool {
    h.magic.load(Acquire) == MAGIC && h.layout_version.load(Relaxed) == LAYOUT_VERSION
}

/// Whether a live creator keeps the segment's name ([`owner::CREATOR`] and
/// the creating process, pid plus start time, still running).
fn claimed_by_creator(h: &Header) -> bool {
    if !valid_magic_and_version(h) || h.owner.load(SeqCst) != owner::CREATOR {
        return false;
    }
    let creator = (h.creator_pid.load(Relaxed), h.creator_start.load(Relaxed));
    creator == sys::self_identity() || sys::process_alive(creator.0, creator.1)
}

/// The last-holder rule. With `fd` open on segment `name`: removes the name
/// if no other open file description holds the segment (an exclusive `flock`
/// on `fd` succeeds), no live creator keeps it (`claimed` is false), and the
/// name still refers to this segment. Returns whether it removed the name.
///
/// A creator that gives its claim up while we hold the exclusive lock sees a
/// holder and leaves the name to it, so after finding a claim we let go of
/// the lock and look once more (a claim ends only once, so this loops at
/// most twice). The caller must not rely on `fd`'s lock afterwards (it is
/// about to close `fd`, or unlocks it anyway).
fn remove_if_last(fd: &OwnedFd, name: &str, claimed: impl Fn() -> bool) -> bool {
    loop {
        if !matches!(sys::try_lock_exclusive(fd), Ok(true)) {
            return false; // held: the last holder decides
        }
        if !claimed() {
            return sys::is_named(fd, name) && sys::shm_unlink(name).is_ok();
        }
        let _ = sys::unlock(fd);
        if claimed() {
            return false; // the creator keeps the name: it decides when it ends
        }
    }
}

/// Maps the header of the segment behind `fd`, if the file is that long.
fn map_header(fd: &OwnedFd) -> Option<sys::Mapping> {
    let header = size_of::<Header>() as u64;
    if sys::file_size(fd).ok()? < header {
        return None;
    }
    sys::Mapping::new(fd, header).ok()
}

fn header_at(map: &sys::Mapping) -> &Header {
    // SAFETY: `map` is at least one header long (`map_header`) and page
    // aligned; Header consists of atomics and the mutex cell.
    unsafe { &*(map.base() as *const Header) }
}

/// Result alias for channel operations.
pub type Result<T> = std::result::Result<T, ChannelError>;

/// Sizes of a new channel.
#[derive(Debug, Clone, Copy)]
pub struct ChannelOptions {
    /// Number of distinct keys the channel can hold.
    pub max_lanes: u32,
    /// Items per lane (the `maxsize` backpressure bound).
    pub lane_capacity: u32,
    /// Most payload blocks alive at once (queued plus leased).
    pub max_blocks: u32,
    /// Payload bytes the arena can hold (the bytes backpressure bound).
    pub arena_bytes: u64,
    /// Free-form number stored in the header for the caller.
    pub user_tag: u32,
}

impl Default for ChannelOptions {
    fn default() -> Self {
        Self {
            max_lanes: 64,
            lane_capacity: 4096,
            max_blocks: 4096,
            arena_bytes: 1 << 30,
            user_tag: 0,
        }
    }
}

/// State shared by a channel handle and every lease taken through it.
pub struct Inner {
    seg_name: String,
    /// The process (pid, start time) that opened `fd`. A forked child
    /// inherits the handle, and with it the parent's `flock`: while the
    /// parent runs, that lock is not the child's to judge.
    opener: (u32, u64),
    fd: OwnedFd,
    map: sys::Mapping,
    geo: Geometry,
    spin: bool,
}

/// A handle on a channel segment. Cloning shares the mapping.
#[derive(Clone)]
pub struct Channel {
    inner: Arc<Inner>,
}

/// A block taken by a consumer. Dropping the last clone frees the block.
pub struct Lease {
    inner: Arc<Inner>,
    block: u32,
    generation: u32,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a lease only points into the shared mapping, which its `Arc<Inner>`
// keeps alive; the block is owned by this lease until it drops.
unsafe impl Send for Lease {}
// SAFETY: as above; the bytes are only read through shared slices.
unsafe impl Sync for Lease {}

impl Lease {
    /// The message bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr..ptr+len` lies inside the mapping (validated when the
        // block was taken) and the mapping lives as long as `inner`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// Start address of the message bytes (for zero-copy views).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Message length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the message is empty (never for a well-formed message).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("block", &self.block)
            .field("generation", &self.generation)
            .field("len", &self.len)
            .finish()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.inner.release(self.block, self.generation);
    }
}

/// What one attempt of a blocking operation produced.
enum Attempt<T> {
    Done(T),
    /// Sleep on the wait word at this index of the caller's list, then retry.
    Wait(usize),
}

/// Counters for introspection and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Carved blocks.
    pub blocks: u32,
    /// Blocks on free lists.
    pub free_blocks: u32,
    /// Blocks leased to consumers.
    pub leased_blocks: u32,
    /// Blocks queued in lanes.
    pub queued_blocks: u32,
    /// Blocks being written.
    pub writing_blocks: u32,
    /// Lanes in use.
    pub lanes: u32,
    /// Arena bytes carved into blocks.
    pub arena_used: u64,
    /// Arena size.
    pub arena_size: u64,
}

struct Guard<'a> {
    inner: &'a Inner,
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        // SAFETY: a Guard exists only while this thread holds the mutex.
        unsafe { sys::mutex_unlock(self.inner.header().mutex.0.get()) }
    }
}

impl Inner {
    fn header(&self) -> &Header {
        // SAFETY: the mapping is at least one page (checked on create and
        // attach), page aligned, and Header consists of atomics and the mutex.
        unsafe { &*(self.map.base() as *const Header) }
    }

    /// Lane `i` of the lanes table.
    ///
    /// # Errors
    /// [`ChannelError::Invalid`] naming `i` and the bound if `i >= max_lanes`.
    fn lane(&self, i: u32) -> Result<&Lane> {
        if i >= self.geo.max_lanes {
            return Err(ChannelError::Invalid(format!(
                "lane index {i} is out of range: the channel has {} lanes",
                self.geo.max_lanes
            )));
        }
        let off = self.geo.lanes_off as usize + i as usize * size_of::<Lane>();
        // SAFETY: i < max_lanes (checked above), and the lanes table lies
        // inside the mapping by the validated geometry; Lane is all atomics.
        Ok(unsafe { &*(self.map.base().add(off) as *const Lane) })
    }

    /// Every lane with its index.
    fn lanes(&self) -> impl Iterator<Item = (u32, &Lane)> {
        (0..self.geo.max_lanes).filter_map(|l| Some((l, self.lane(l).ok()?)))
    }

    fn slot(&self, lane: u32, pos: u64) -> &Slot {
        // Callers pass lanes they got through `lane` (or `check_lane`); a
        // bad index here is a bug, not bad shared memory.
        assert!(
            lane < self.geo.max_lanes,
            "lane index {lane} is out of range: the channel has {} lanes",
            self.geo.max_lanes
        );
        let cap = self.geo.lane_capacity as u64;
        let idx = lane as u64 * cap + pos % cap;
        let off = self.geo.slots_off as usize + idx as usize * size_of::<Slot>();
        // SAFETY: lane < max_lanes (asserted above) and pos % cap < cap, so the slot lies inside
        // the rings table of the validated geometry; Slot is all atomics.
        unsafe { &*(self.map.base().add(off) as *const Slot) }
    }

    /// Metadata of block `b` of the block table.
    ///
    /// # Errors
    /// [`ChannelError::Corrupt`] naming `b` and the bound if
    /// `b >= max_blocks` (block indices are read from shared memory).
    fn meta(&self, b: u32) -> Result<&BlockMeta> {
        if b >= self.geo.max_blocks {
            return Err(ChannelError::Corrupt(format!(
                "block index {b} is out of range: the channel has {} blocks",
                self.geo.max_blocks
            )));
        }
        let off = self.geo.blocks_off as usize + b as usize * size_of::<BlockMeta>();
        // SAFETY: b < max_blocks (checked above), inside the validated block
        // table; BlockMeta is all atomics.
        Ok(unsafe { &*(self.map.base().add(off) as *const BlockMeta) })
    }

    /// Blocks `0..n` (clamped to the table) with their metadata.
    fn metas(&self, n: u32) -> impl Iterator<Item = (u32, &BlockMeta)> {
        (0..n.min(self.geo.max_blocks)).filter_map(|b| Some((b, self.meta(b).ok()?)))
    }

    /// Bounds of block `b` in the mapping, validated (its metadata is untrusted).
    fn block_range(&self, b: u32) -> Result<(usize, usize)> {
        let m = self.meta(b)?;
        let (off, cap) = (m.off.load(Relaxed), m.cap.load(Relaxed));
        match off.checked_add(cap) {
            Some(end) if end <= self.geo.arena_size => {
                Ok(((self.geo.arena_off + off) as usize, cap as usize))
            }
            _ => Err(ChannelError::Corrupt(format!(
                "block {b} lies outside the arena"
            ))),
        }
    }

    fn map_len(&self) -> usize {
        self.geo.total_size as usize
    }

    fn lock(&self) -> Result<Guard<'_>> {
        // SAFETY: the mutex was initialised by the creator before the magic
        // was published, and attach validated the magic.
        let state = unsafe { sys::mutex_lock(self.header().mutex.0.get(), LOCK_TIMEOUT)? };
        let guard = Guard { inner: self };
        if state == sys::LockState::OwnerDied {
            self.repair_locked();
        }
        Ok(guard)
    }

    fn closed(&self) -> bool {
        self.header().closed.load(Acquire) != 0
    }

    fn notify(&self, w: &WaitWord) {
        w.last_cpu.store(spin::current_cpu(), Relaxed);
        w.seq.fetch_add(1, SeqCst);
        if w.waiters.load(SeqCst) > 0 {
            sys::futex_wake_all(&w.seq);
        }
    }

    /// Runs `attempt` until it is done, sleeping on `words[i]` when it says so.
    fn wait_loop<T>(
        &self,
        words: &[&WaitWord],
        deadline: Option<Instant>,
        nonblocking_error: Option<ChannelError>,
        mut attempt: impl FnMut(&Self) -> Result<Attempt<T>>,
    ) -> Result<T> {
        let mut nonblocking_error = nonblocking_error;
        loop {
            // Read the event counters before looking at the state: any change
            // after the look bumps a counter, so it cannot be missed below.
            let seqs: Vec<u32> = words.iter().map(|w| w.seq.load(SeqCst)).collect();
            let which = match attempt(self)? {
                Attempt::Done(v) => return Ok(v),
                Attempt::Wait(i) => i,
            };
            if let Some(err) = nonblocking_error.take() {
                return Err(err);
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Err(ChannelError::Timeout);
            }
            let word = words[which];
            let seen = seqs[which];
            // Phase 1: spin, not registered as a waiter, so a producer that
            // finds nobody asleep skips its wake-up syscall.
            let mut colocated = self.spin && word.last_cpu.load(Relaxed) == spin::current_cpu();
            if colocated {
                // Moving away makes spinning useful again.
                colocated = !spin::colocated_wait();
            } else {
                spin::not_colocated();
            }
            if spin::spin_until_changed(&word.seq, seen, self.spin && !colocated) {
                continue;
            }
            // Phase 2: register, re-check, sleep for at most one slice.
            word.waiters.fetch_add(1, SeqCst);
            if word.seq.load(SeqCst) != seen {
                word.waiters.fetch_sub(1, SeqCst);
                continue;
            }
            let slice = deadline.map_or(WAIT_SLICE, |d| (d - now).min(WAIT_SLICE));
            let started = Instant::now();
            spin::counters::SLEEPS.fetch_add(1, Relaxed);
            sys::futex_wait(&word.seq, seen, slice);
            word.waiters.fetch_sub(1, SeqCst);
            if started.elapsed() >= slice {
                // A full slice passed with no event: a peer may have died.
                self.reclaim_dead()?;
            }
        }
    }

    /// Pops a free block of class `c`, marking it written by us.
    fn pop_free_locked(&self, c: usize) -> Option<u32> {
        let h = self.header();
        let b = h.free_heads[c].load(Relaxed);
        if b == NONE {
            return None;
        }
        if b >= h.n_blocks.load(Relaxed).min(self.geo.max_blocks) {
            // Corrupt list: drop it; a repair rebuilds lists from block states.
            h.free_heads[c].store(NONE, Relaxed);
            return None;
        }
        let m = self.meta(b).ok()?;
        let next = m.next_free.load(Relaxed);
        self.claim_locked(m);
        h.free_heads[c].store(next, Relaxed);
        Some(b)
    }

    fn claim_locked(&self, m: &BlockMeta) {
        let (pid, start) = sys::self_identity();
        m.generation
            .store(m.generation.load(Relaxed).wrapping_add(1), Relaxed);
        m.owner_pid.store(pid, Relaxed);
        m.owner_start.store(start, Relaxed);
        m.state.store(block_state::WRITING, Release);
    }

    /// Allocates a block of at least `size` bytes. Returns `(block, fresh)`;
    /// fresh blocks were just carved and are not yet faulted in.
    fn alloc_locked(&self, size: u64) -> Option<(u32, bool)> {
        let h = self.header();
        let c = class_for(size)?;
        if let Some(b) = self.pop_free_locked(c) {
            return Some((b, false));
        }
        let n = h.n_blocks.load(Relaxed);
        let bump = h.arena_bump.load(Relaxed);
        let cap = class_size(c);
        if n < self.geo.max_blocks
            && bump
                .checked_add(cap)
                .is_some_and(|end| end <= self.geo.arena_size)
        {
            let m = self.meta(n).ok()?;
            m.off.store(bump, Relaxed);
            m.cap.store(cap, Relaxed);
            m.class.store(c as u32, Relaxed);
            m.next_free.store(NONE, Relaxed);
            self.claim_locked(m);
            h.n_blocks.store(n + 1, Release); // commit
            h.arena_bump.store(bump + cap, Relaxed);
            return Some((n, true));
        }
        // Borrow from larger classes, wasting at most 2x.
        for c2 in (c + 1)..(c + 5).min(NUM_CLASSES) {
            if let Some(b) = self.pop_free_locked(c2) {
                return Some((b, false));
            }
        }
        // Everything carved is free: reset the carving so any size fits again.
        if n > 0
            && (0..n).all(|b| {
                self.meta(b)
                    .is_ok_and(|m| m.state.load(Relaxed) == block_state::FREE)
            })
        {
            for f in &h.free_heads {
                f.store(NONE, Relaxed);
            }
            h.n_blocks.store(0, Release);
            h.arena_bump.store(0, Relaxed);
            return self.alloc_locked(size);
        }
        None
    }

    /// Frees block `b`, whose metadata is `m`.
    fn free_locked(&self, b: u32, m: &BlockMeta) {
        let h = self.header();
        let c = (m.class.load(Relaxed) as usize).min(NUM_CLASSES - 1);
        m.owner_pid.store(0, Relaxed);
        m.state.store(block_state::FREE, Release);
        m.next_free.store(h.free_heads[c].load(Relaxed), Relaxed);
        h.free_heads[c].store(b, Relaxed); // commit
    }

    /// Frees blocks held by dead processes and tombstones their reserved slots.
    /// Returns the number of blocks reclaimed.
    fn reclaim_dead(&self) -> Result<usize> {
        let _g = self.lock()?;
        let n = self.reclaim_dead_locked();
        drop(_g);
        if n > 0 {
            self.notify_all_words();
        }
        Ok(n)
    }

    fn notify_all_words(&self) {
        let h = self.header();
        self.notify(&h.space);
        for (_, lane) in self.lanes() {
            if lane.in_use.load(Acquire) != 0 {
                self.notify(&lane.not_empty);
                self.notify(&lane.not_full);
            }
        }
    }

    fn reclaim_dead_locked(&self) -> usize {
        let h = self.header();
        let n = h.n_blocks.load(Relaxed).min(self.geo.max_blocks);
        let live_slots = self.live_slots_locked();
        let mut alive: HashMap<(u32, u64), bool> = HashMap::new();
        let mut reclaimed = 0;
        for (b, m) in self.metas(n) {
            let st = m.state.load(Acquire);
            if !matches!(
                st,
                block_state::WRITING | block_state::LEASED | block_state::QUEUED
            ) {
                continue;
            }
            let who = (m.owner_pid.load(Relaxed), m.owner_start.load(Relaxed));
            if who.0 == 0
                || *alive
                    .entry(who)
                    .or_insert_with(|| sys::process_alive(who.0, who.1))
            {
                continue;
            }
            let generation = m.generation.load(Relaxed);
            match live_slots.get(&b) {
                // Published (the producer may have died before marking the block).
                Some(&(_, _, slot_state::READY, g)) if g == generation => {
                    if st == block_state::WRITING {
                        m.state.store(block_state::QUEUED, Release);
                    }
                    continue;
                }
                // Reserved by a dead producer: never complete, skip it.
                Some(&(lane, pos, slot_state::RESERVED, g)) if g == generation => {
                    self.slot(lane, pos)
                        .state
                        .store(slot_state::TOMBSTONE, Release);
                }
                // Not in any lane: a dead consumer's lease, an abandoned
                // reservation, or a leak.
                _ => {}
            }
            self.free_locked(b, m);
            reclaimed += 1;
        }
        reclaimed
    }

    /// Block -> (lane, position, slot state, generation) for every slot
    /// between a lane's head and tail.
    fn live_slots_locked(&self) -> HashMap<u32, (u32, u64, u32, u32)> {
        let mut live = HashMap::new();
        for (l, lane) in self.lanes() {
            if lane.in_use.load(Acquire) == 0 {
                continue;
            }
            let (head, tail) = (lane.head.load(Acquire), lane.tail.load(Acquire));
            for pos in head..tail.min(head + self.geo.lane_capacity as u64) {
                let s = self.slot(l, pos);
                let entry = (l, pos, s.state.load(Acquire), s.generation.load(Relaxed));
                live.insert(s.block.load(Relaxed), entry);
            }
        }
        live
    }

    /// Rebuilds derived state after a lock holder died mid-section.
    fn repair_locked(&self) {
        let h = self.header();
        let max_blocks = self.geo.max_blocks;
        let n = h.n_blocks.load(Relaxed).min(max_blocks);
        h.n_blocks.store(n, Relaxed);
        // 1. Lane positions and the blocks their live slots reference:
        //    block -> (lane, position, slot state).
        let mut referenced: Vec<Option<(u32, u64, u32)>> = vec![None; n as usize];
        for (l, lane) in self.lanes() {
            if lane.in_use.load(Acquire) == 0 {
                continue;
            }
            let (head, mut tail) = (lane.head.load(Relaxed), lane.tail.load(Relaxed));
            if tail < head || tail - head > self.geo.lane_capacity as u64 {
                tail = head;
                lane.tail.store(tail, Relaxed);
            }
            for pos in head..tail {
                let s = self.slot(l, pos);
                let st = s.state.load(Relaxed);
                let b = s.block.load(Relaxed);
                let valid = b < n
                    && self
                        .meta(b)
                        .is_ok_and(|m| s.generation.load(Relaxed) == m.generation.load(Relaxed));
                match st {
                    slot_state::READY | slot_state::RESERVED if valid => {
                        referenced[b as usize] = Some((l, pos, st))
                    }
                    slot_state::TOMBSTONE => {}
                    _ => s.state.store(slot_state::TOMBSTONE, Relaxed),
                }
            }
        }
        // 2. Block states from references and owner liveness.
        let mut max_end = 0u64;
        for (b, m) in self.metas(n) {
            let end = m.off.load(Relaxed).saturating_add(m.cap.load(Relaxed));
            if end > self.geo.arena_size || (m.class.load(Relaxed) as usize) >= NUM_CLASSES {
                // Unusable metadata: forget this block and everything after it.
                h.n_blocks.store(b, Relaxed);
                break;
            }
            max_end = max_end.max(end);
            let who = (m.owner_pid.load(Relaxed), m.owner_start.load(Relaxed));
            let owner_alive = who.0 != 0 && sys::process_alive(who.0, who.1);
            match referenced[b as usize] {
                Some((_, _, slot_state::READY)) => m.state.store(block_state::QUEUED, Relaxed),
                Some((_, _, slot_state::RESERVED)) if owner_alive => {
                    m.state.store(block_state::WRITING, Relaxed)
                }
                Some((lane, pos, slot_state::RESERVED)) => {
                    // Reserved by a dead producer: never complete, skip it.
                    self.slot(lane, pos)
                        .state
                        .store(slot_state::TOMBSTONE, Relaxed);
                    m.state.store(block_state::FREE, Relaxed);
                }
                _ => {
                    let st = m.state.load(Relaxed);
                    let keep =
                        (st == block_state::LEASED || st == block_state::WRITING) && owner_alive;
                    if !keep {
                        m.state.store(block_state::FREE, Relaxed);
                    }
                }
            }
        }
        h.arena_bump.store(max_end, Relaxed);
        // 3. Free lists from block states.
        for f in &h.free_heads {
            f.store(NONE, Relaxed);
        }
        for (b, m) in self.metas(h.n_blocks.load(Relaxed)) {
            if m.state.load(Relaxed) == block_state::FREE {
                self.free_locked(b, m);
            }
        }
    }

    /// Ends a lease: frees the block if we still own it.
    fn release(&self, b: u32, generation: u32) {
        // `b` came from a validated slot when the lease was taken.
        let (Ok(g), Ok(m)) = (self.lock(), self.meta(b)) else {
            return;
        };
        let freed = m.generation.load(Relaxed) == generation
            && m.state.load(Relaxed) == block_state::LEASED
            && m.owner_pid.load(Relaxed) == sys::self_identity().0;
        if freed {
            self.free_locked(b, m);
        }
        drop(g);
        if freed {
            self.notify(&self.header().space);
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The last process to let go removes the name, so nothing leaks,
        // unless the segment's creator is alive and keeps it.
        let (pid, start) = self.opener;
        if pid != std::process::id() && sys::process_alive(pid, start) {
            return;
        }
        remove_if_last(&self.fd, &self.seg_name, || {
            claimed_by_creator(self.header())
        });
    }
}

impl Channel {
    /// Creates a new channel segment `rlinf.<namespace>.<name>`. Its name
    /// lives while some process holds the segment: the last handle to go
    /// (in any process) removes it.
    ///
    /// # Errors
    /// [`ChannelError::Exists`] if the segment exists, [`ChannelError::Invalid`]
    /// for bad sizes or too little space in `/dev/shm`, or an OS error.
    pub fn create(namespace: &str, name: &str, opts: ChannelOptions) -> Result<Self> {
        Self::create_impl(namespace, name, opts, false)
    }

    /// Creates a new channel segment whose name this process keeps until it
    /// ends or gives it up ([`release_owned_names`], [`release_all_names`]),
    /// whether or not it still holds a handle; after that, the last holder
    /// removes it as for [`Channel::create`]. A creator that dies keeps
    /// nothing: its liveness (pid and start time) is checked, not a lock.
    ///
    /// # Errors
    /// As [`Channel::create`].
    pub fn create_owned(namespace: &str, name: &str, opts: ChannelOptions) -> Result<Self> {
        Self::create_impl(namespace, name, opts, true)
    }

    fn create_impl(namespace: &str, name: &str, opts: ChannelOptions, owned: bool) -> Result<Self> {
        let seg_name = segment_name(namespace, name)?;
        let check = |ok: bool, what: &str| {
            if ok {
                Ok(())
            } else {
                Err(ChannelError::Invalid(what.to_owned()))
            }
        };
        check(
            (1..=MAX_LANES_LIMIT).contains(&opts.max_lanes),
            &format!(
                "max_keys must be in 1..={MAX_LANES_LIMIT}, got {}",
                opts.max_lanes
            ),
        )?;
        check(
            (1..=MAX_CAPACITY_LIMIT).contains(&opts.lane_capacity),
            &format!(
                "maxsize must be in 0..={MAX_CAPACITY_LIMIT}, got {}",
                opts.lane_capacity
            ),
        )?;
        check(
            (1..=MAX_BLOCKS_LIMIT).contains(&opts.max_blocks),
            &format!(
                "max_items must be in 1..={MAX_BLOCKS_LIMIT}, got {}",
                opts.max_blocks
            ),
        )?;
        check(
            opts.arena_bytes >= 1 << 16,
            &format!(
                "capacity_bytes must be at least 65536, got {}",
                opts.arena_bytes
            ),
        )?;
        let geo = Geometry::new(
            opts.max_lanes,
            opts.lane_capacity,
            opts.max_blocks,
            opts.arena_bytes,
        )
        .ok_or_else(|| ChannelError::Invalid("channel sizes overflow".into()))?;
        let free = sys::shm_free_bytes()?;
        if geo.total_size > free {
            return Err(ChannelError::Invalid(format!(
                "channel needs {} bytes of /dev/shm but only {free} are free; pass a smaller \
                 capacity_bytes or enlarge /dev/shm (e.g. docker --shm-size)",
                geo.total_size
            )));
        }
        let mut created = sys::shm_create(&seg_name, geo.total_size);
        if matches!(&created, Err(e) if e.kind() == io::ErrorKind::AlreadyExists)
            && remove_if_stale(&seg_name)
        {
            created = sys::shm_create(&seg_name, geo.total_size);
        }
        let fd = created.map_err(|e| {
            if e.kind() == io::ErrorKind::AlreadyExists {
                ChannelError::Exists(seg_name.clone())
            } else {
                ChannelError::Io(e)
            }
        })?;
        sys::lock_shared(&fd)?;
        let map = sys::Mapping::new(&fd, geo.total_size)?;
        let inner = Inner {
            seg_name,
            opener: sys::self_identity(),
            fd,
            map,
            geo,
            spin: spin::supported(),
        };
        let h = inner.header();
        h.layout_version.store(LAYOUT_VERSION, Relaxed);
        h.header_size.store(size_of::<Header>() as u32, Relaxed);
        h.total_size.store(geo.total_size, Relaxed);
        h.max_lanes.store(geo.max_lanes, Relaxed);
        h.lane_capacity.store(geo.lane_capacity, Relaxed);
        h.max_blocks.store(geo.max_blocks, Relaxed);
        let (pid, start) = sys::self_identity();
        h.creator_pid.store(pid, Relaxed);
        h.creator_start.store(start, Relaxed);
        let keeper = if owned {
            owner::CREATOR
        } else {
            owner::HOLDERS
        };
        h.owner.store(keeper, Relaxed);
        h.lanes_off.store(geo.lanes_off, Relaxed);
        h.slots_off.store(geo.slots_off, Relaxed);
        h.blocks_off.store(geo.blocks_off, Relaxed);
        h.arena_off.store(geo.arena_off, Relaxed);
        h.arena_size.store(geo.arena_size, Relaxed);
        h.user_tag.store(opts.user_tag, Relaxed);
        for f in &h.free_heads {
            f.store(NONE, Relaxed);
        }
        // SAFETY: the segment was just created with O_EXCL and its magic is
        // not published yet, so no other process can be using the mutex.
        unsafe { sys::mutex_init(h.mutex.0.get())? };
        h.magic.store(MAGIC, Release); // publish: attachers may proceed
        if owned {
            if let Ok(mut names) = OWNED_NAMES.lock() {
                // Forget names removed since (unlinked by anyone).
                names.retain(|n| std::path::Path::new(sys::SHM_DIR).join(n).exists());
                if !names.contains(&inner.seg_name) {
                    names.push(inner.seg_name.clone());
                }
            }
        }
        Ok(register(inner))
    }

    /// Attaches to an existing channel segment, validating its header.
    ///
    /// # Errors
    /// [`ChannelError::NotFound`] if there is no such segment,
    /// [`ChannelError::Corrupt`] if its header fails validation.
    pub fn attach(namespace: &str, name: &str) -> Result<Self> {
        let seg_name = segment_name(namespace, name)?;
        let fd = sys::shm_open_existing(&seg_name).map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                ChannelError::NotFound(seg_name.clone())
            } else {
                ChannelError::Io(e)
            }
        })?;
        sys::lock_shared(&fd)?;
        // The creator may still be sizing or initialising the segment.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let size = sys::file_size(&fd)?;
            if size >= size_of::<Header>() as u64 {
                let map = sys::Mapping::new(&fd, size)?;
                // SAFETY: the mapping is at least one header long and page
                // aligned; Header consists of atomics and the mutex cell.
                let header = unsafe { &*(map.base() as *const Header) };
                match header.magic.load(Acquire) {
                    MAGIC => {
                        let geo = validate_header(header, size)?;
                        let inner = Inner {
                            seg_name,
                            opener: sys::self_identity(),
                            fd,
                            map,
                            geo,
                            spin: spin::supported(),
                        };
                        return Ok(register(inner));
                    }
                    0 => {} // not initialised yet
                    other => return Err(ChannelError::Corrupt(format!("bad magic {other:#x}"))),
                }
            }
            if Instant::now() >= deadline {
                return Err(ChannelError::Corrupt(format!(
                    "segment {seg_name:?} was never initialised (creator died during creation?)"
                )));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// This handle's whole mapping of the segment (base, length), for a
    /// transport that registers it (the UCX agent). Valid while any clone of
    /// this handle lives.
    pub fn mapped_region(&self) -> (*mut u8, usize) {
        (self.inner.map.base(), self.inner.map.size())
    }

    /// The shared-memory segment name (`rlinf.<namespace>.<name>`).
    pub fn segment_name(&self) -> &str {
        &self.inner.seg_name
    }

    /// The number stored by the creator in [`ChannelOptions::user_tag`].
    pub fn user_tag(&self) -> u32 {
        self.inner.header().user_tag.load(Relaxed)
    }

    /// Items per lane.
    pub fn lane_capacity(&self) -> u32 {
        self.inner.geo.lane_capacity
    }

    /// Arena size in bytes.
    pub fn arena_size(&self) -> u64 {
        self.inner.geo.arena_size
    }

    /// Returns the lane for `key`, creating it on first use.
    ///
    /// # Errors
    /// [`ChannelError::Invalid`] if the key is too long or every lane is taken.
    pub fn lane(&self, key: &[u8]) -> Result<u32> {
        if key.len() > KEY_MAX {
            return Err(ChannelError::Invalid(format!(
                "key is {} bytes once encoded, over the limit of {KEY_MAX}; use a shorter key",
                key.len()
            )));
        }
        let hash = key_hash(key);
        let inner = &*self.inner;
        let find = || {
            inner
                .lanes()
                .find(|(_, lane)| {
                    lane.in_use.load(Acquire) != 0
                        && lane.key_hash.load(Relaxed) == hash
                        && lane.key_len.load(Relaxed) as usize == key.len()
                        && lane_key(lane) == key
                })
                .map(|(l, _)| l)
        };
        if let Some(l) = find() {
            return Ok(l);
        }
        let _g = inner.lock()?;
        if let Some(l) = find() {
            return Ok(l);
        }
        let free = inner
            .lanes()
            .find(|(_, lane)| lane.in_use.load(Acquire) == 0);
        let Some((l, lane)) = free else {
            return Err(ChannelError::Invalid(format!(
                "all {} keys of this channel are in use; create it with a larger max_keys",
                inner.geo.max_lanes
            )));
        };
        for (w, v) in lane.key.iter().zip(key_words(key)) {
            w.store(v, Relaxed);
        }
        lane.key_len.store(key.len() as u32, Relaxed);
        lane.key_hash.store(hash, Relaxed);
        lane.head.store(0, Relaxed);
        lane.tail.store(0, Relaxed);
        lane.in_use.store(1, Release); // commit
        Ok(l)
    }

    fn check_lane(&self, lane: u32) -> Result<&Lane> {
        let l = self.inner.lane(lane)?;
        if l.in_use.load(Acquire) == 0 {
            return Err(ChannelError::Invalid(format!("lane {lane} does not exist")));
        }
        Ok(l)
    }

    /// Puts one message: `header` plus out-of-band `buffers`.
    ///
    /// Blocks while the lane is full or the arena has no room (backpressure
    /// happens before any payload byte moves), at most until `timeout`.
    ///
    /// # Errors
    /// [`ChannelError::Full`] when `nonblocking` and no room,
    /// [`ChannelError::Timeout`], [`ChannelError::Closed`], or
    /// [`ChannelError::Invalid`] for a message larger than the arena.
    pub fn put(
        &self,
        lane: u32,
        header: &[u8],
        buffers: &[&[u8]],
        weight: i64,
        timeout: Option<Duration>,
        nonblocking: bool,
    ) -> Result<()> {
        let lens: Vec<usize> = buffers.iter().map(|b| b.len()).collect();
        let total = message_size(header.len(), &lens);
        let mut pending = self.reserve_put(lane, total, weight, timeout, nonblocking)?;
        // Copy outside the lock: the block is ours (WRITING), the slot RESERVED.
        write_message(pending.block_mut(), header, buffers);
        pending.publish();
        Ok(())
    }

    /// Reserves room for a message of exactly `total` bytes (see
    /// [`message_size`]) and returns it for filling. Publish it with
    /// [`PendingPut::publish`]; dropping it unpublished withdraws the item.
    ///
    /// # Errors
    /// As for [`Channel::put`].
    pub fn reserve_put(
        &self,
        lane: u32,
        total: u64,
        weight: i64,
        timeout: Option<Duration>,
        nonblocking: bool,
    ) -> Result<PendingPut> {
        let r = self.reserve(lane, total, weight, timeout, nonblocking)?;
        Ok(PendingPut {
            ch: self.clone(),
            lane,
            r: Some(r),
            len: total as usize,
        })
    }

    /// Claims a slot and a block of `total` bytes (the first half of a put).
    fn reserve(
        &self,
        lane: u32,
        total: u64,
        weight: i64,
        timeout: Option<Duration>,
        nonblocking: bool,
    ) -> Result<Reservation> {
        let lane_ref = self.check_lane(lane)?;
        let inner = &*self.inner;
        if total > inner.geo.arena_size {
            return Err(ChannelError::Invalid(format!(
                "message needs {total} bytes but the channel holds at most {}; create it with a \
                 larger capacity_bytes",
                inner.geo.arena_size
            )));
        }
        let cap = inner.geo.lane_capacity as u64;
        let deadline = timeout.map(|t| Instant::now() + t);
        let words = [&lane_ref.not_full, &inner.header().space];
        let mut reclaimed = false;
        let (block, pos, fresh) = inner.wait_loop(
            &words,
            deadline,
            nonblocking.then_some(ChannelError::Full),
            |inner| {
                if inner.closed() {
                    return Err(ChannelError::Closed);
                }
                let _g = inner.lock()?;
                let (head, tail) = (lane_ref.head.load(Relaxed), lane_ref.tail.load(Relaxed));
                if tail.wrapping_sub(head) >= cap {
                    return Ok(Attempt::Wait(0));
                }
                let mut got = inner.alloc_locked(total);
                if got.is_none() && !reclaimed {
                    reclaimed = true;
                    if inner.reclaim_dead_locked() > 0 {
                        got = inner.alloc_locked(total);
                    }
                }
                let Some((b, fresh)) = got else {
                    return Ok(Attempt::Wait(1));
                };
                let slot = inner.slot(lane, tail);
                slot.block.store(b, Relaxed);
                slot.generation
                    .store(inner.meta(b)?.generation.load(Relaxed), Relaxed);
                slot.weight.store(weight as u64, Relaxed);
                slot.len.store(total, Relaxed);
                slot.state.store(slot_state::RESERVED, Release);
                lane_ref.tail.store(tail + 1, Release); // commit the reservation
                Ok(Attempt::Done((b, tail, fresh)))
            },
        )?;
        let (start, cap) = inner.block_range(block)?;
        let fits = (total as usize) <= cap && start + total as usize <= inner.map_len();
        let populated = !fresh || inner.map.populate_write(start as u64, total).is_ok();
        if !fits || !populated {
            let g = inner.lock()?;
            inner
                .slot(lane, pos)
                .state
                .store(slot_state::TOMBSTONE, Release);
            inner.free_locked(block, inner.meta(block)?);
            drop(g);
            inner.notify(&lane_ref.not_empty);
            return Err(if fits {
                ChannelError::Invalid(format!(
                    "could not allocate {total} bytes in /dev/shm; free space there or pass a \
                     smaller capacity_bytes"
                ))
            } else {
                ChannelError::Corrupt(format!("block {block} is smaller than its class"))
            });
        }
        Ok(Reservation { block, pos, start })
    }

    /// Publishes a reserved, fully written message (the second half of a put).
    fn publish(&self, lane: u32, r: Reservation) {
        let inner = &*self.inner;
        // `reserve` checked `lane` and `r.block`, so the lookups below succeed.
        // The slot store is the commit. A producer killed right after it
        // leaves a WRITING block behind a READY slot, which the liveness pass
        // recognises as published (it marks the block QUEUED). The block
        // update is a CAS because a consumer may already have leased it.
        inner
            .slot(lane, r.pos)
            .state
            .store(slot_state::READY, Release);
        if let Ok(m) = inner.meta(r.block) {
            let _ = m.state.compare_exchange(
                block_state::WRITING,
                block_state::QUEUED,
                AcqRel,
                Relaxed,
            );
        }
        if let Ok(l) = inner.lane(lane) {
            inner.notify(&l.not_empty);
        }
    }

    /// Test hook: reserves a slot and a block and writes half a message, but
    /// never publishes it, as a producer killed mid-put would leave things.
    #[doc(hidden)]
    pub fn debug_reserve_without_publish(&self, lane: u32, total: u64) -> Result<()> {
        let mut pending = self.reserve_put(lane, total, 0, Some(Duration::from_secs(5)), false)?;
        pending.block_mut()[..total as usize / 2].fill(0xAB);
        std::mem::forget(pending);
        Ok(())
    }

    /// Test hook: takes the channel lock and holds it for `hold`, as a process
    /// killed inside a critical section would leave it.
    #[doc(hidden)]
    pub fn debug_hold_lock(&self, hold: Duration) -> Result<()> {
        let _g = self.inner.lock()?;
        std::thread::sleep(hold);
        Ok(())
    }

    /// Withdraws a reservation: the slot becomes a tombstone, the block is freed.
    fn abort(&self, lane: u32, r: Reservation) {
        let inner = &*self.inner;
        // `reserve` checked `lane` and `r.block`, so the lookups below succeed.
        if let (Ok(g), Ok(m)) = (inner.lock(), inner.meta(r.block)) {
            inner
                .slot(lane, r.pos)
                .state
                .store(slot_state::TOMBSTONE, Release);
            inner.free_locked(r.block, m);
            drop(g);
        }
        if let Ok(l) = inner.lane(lane) {
            inner.notify(&l.not_empty);
        }
        inner.notify(&inner.header().space);
    }

    /// Takes the next message of `lane`, waiting at most `timeout`.
    ///
    /// # Errors
    /// [`ChannelError::Empty`] when `nonblocking` and nothing is ready,
    /// [`ChannelError::Timeout`], or [`ChannelError::Closed`] once the
    /// channel is closed and drained.
    pub fn get(&self, lane: u32, timeout: Option<Duration>, nonblocking: bool) -> Result<Lease> {
        let mut batch = self.take(lane, TakeRule::One, timeout, nonblocking)?;
        batch.pop().ok_or(ChannelError::Empty)
    }

    /// Takes messages in FIFO order while their weights sum to at most
    /// `target`, stopping once the sum reaches `target`; waits for more.
    ///
    /// # Errors
    /// [`ChannelError::Invalid`] if the next item would overshoot the target
    /// before it is reached, plus the errors of [`Channel::get`].
    pub fn get_batch(
        &self,
        lane: u32,
        target: i64,
        timeout: Option<Duration>,
    ) -> Result<Vec<Lease>> {
        if target <= 0 {
            return Err(ChannelError::Invalid(format!(
                "target_weight must be positive, got {target}"
            )));
        }
        self.take(lane, TakeRule::Weight(target), timeout, false)
    }

    fn take(
        &self,
        lane: u32,
        rule: TakeRule,
        timeout: Option<Duration>,
        nonblocking: bool,
    ) -> Result<Vec<Lease>> {
        let lane_ref = self.check_lane(lane)?;
        let inner = &*self.inner;
        let deadline = timeout.map(|t| Instant::now() + t);
        let taken = inner.wait_loop(
            &[&lane_ref.not_empty],
            deadline,
            nonblocking.then_some(ChannelError::Empty),
            |inner| {
                let _g = inner.lock()?;
                let head = lane_ref.head.load(Relaxed);
                let tail = lane_ref.tail.load(Relaxed);
                // Plan: how many positions to consume, and which hold items.
                let mut acc: i64 = 0;
                let mut items: Vec<u64> = Vec::new();
                let mut end = head;
                let mut ready = false;
                while end < tail {
                    let s = inner.slot(lane, end);
                    match s.state.load(Acquire) {
                        slot_state::TOMBSTONE => end += 1,
                        slot_state::READY => {
                            let w = s.weight.load(Relaxed) as i64;
                            if let TakeRule::Weight(target) = rule {
                                if acc.saturating_add(w) > target {
                                    return Err(ChannelError::Invalid(format!(
                                        "get_batch: the next item's weight {w} would take the batch \
                                         from {acc} past the target {target}; weights must add up \
                                         to the target exactly"
                                    )));
                                }
                            }
                            acc = acc.saturating_add(w);
                            items.push(end);
                            end += 1;
                            let done = match rule {
                                TakeRule::One => true,
                                TakeRule::Weight(target) => acc >= target,
                            };
                            if done {
                                ready = true;
                                break;
                            }
                        }
                        _ => break, // RESERVED: the producer is still writing
                    }
                }
                if !ready {
                    if end > head && items.is_empty() {
                        lane_ref.head.store(end, Release); // drop leading tombstones
                    }
                    if inner.closed() && end == tail {
                        return Err(ChannelError::Closed);
                    }
                    return Ok(Attempt::Wait(0));
                }
                let (pid, start) = sys::self_identity();
                let mut out = Vec::with_capacity(items.len());
                for &pos in &items {
                    let s = inner.slot(lane, pos);
                    let b = s.block.load(Relaxed);
                    let (start_off, cap) = inner.block_range(b)?;
                    let len = s.len.load(Relaxed);
                    let m = inner.meta(b)?;
                    if len as usize > cap || s.generation.load(Relaxed) != m.generation.load(Relaxed) {
                        return Err(ChannelError::Corrupt(format!("slot {pos} has a stale or oversized block")));
                    }
                    m.owner_pid.store(pid, Relaxed);
                    m.owner_start.store(start, Relaxed);
                    m.state.store(block_state::LEASED, Release);
                    out.push((b, m.generation.load(Relaxed), start_off, len as usize));
                }
                lane_ref.head.store(end, Release); // commit
                Ok(Attempt::Done(out))
            },
        )?;
        inner.notify(&lane_ref.not_full);
        Ok(taken
            .into_iter()
            .map(|(block, generation, off, len)| Lease {
                inner: Arc::clone(&self.inner),
                block,
                generation,
                // SAFETY: off+len lies inside the mapping (validated above).
                ptr: unsafe { inner.map.base().add(off) },
                len,
            })
            .collect())
    }

    /// Waits until `lane` has a published item (without taking it).
    /// Returns false on timeout.
    ///
    /// # Errors
    /// [`ChannelError::Closed`] if the channel is closed and the lane drained.
    pub fn wait_readable(&self, lane: u32, timeout: Duration) -> Result<bool> {
        let lane_ref = self.check_lane(lane)?;
        let r = self.inner.wait_loop(
            &[&lane_ref.not_empty],
            Some(Instant::now() + timeout),
            None,
            |inner| {
                let head = lane_ref.head.load(Acquire);
                let tail = lane_ref.tail.load(Acquire);
                if head < tail && inner.slot(lane, head).state.load(Acquire) != slot_state::RESERVED
                {
                    return Ok(Attempt::Done(()));
                }
                if inner.closed() && head == tail {
                    return Err(ChannelError::Closed);
                }
                Ok(Attempt::Wait(0))
            },
        );
        match r {
            Ok(()) => Ok(true),
            Err(ChannelError::Timeout) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Items in `lane` (published or being written).
    pub fn qsize(&self, lane: u32) -> Result<u64> {
        let l = self.check_lane(lane)?;
        let head = l.head.load(Acquire);
        Ok(l.tail.load(Acquire).saturating_sub(head))
    }

    /// Closes the channel for every process and wakes every waiter.
    /// Idempotent. Items already queued can still be taken.
    pub fn close(&self) {
        self.inner.header().closed.store(1, Release);
        self.inner.notify_all_words();
    }

    /// Whether the channel was closed.
    pub fn is_closed(&self) -> bool {
        self.inner.closed()
    }

    /// Frees blocks held by dead processes; returns how many.
    ///
    /// # Errors
    /// Only if the channel lock cannot be taken.
    pub fn reclaim(&self) -> Result<usize> {
        self.inner.reclaim_dead()
    }

    /// Counters for introspection.
    ///
    /// # Errors
    /// Only if the channel lock cannot be taken.
    pub fn stats(&self) -> Result<Stats> {
        let inner = &*self.inner;
        let _g = inner.lock()?;
        let h = inner.header();
        let mut s = Stats {
            blocks: h.n_blocks.load(Relaxed),
            arena_used: h.arena_bump.load(Relaxed),
            arena_size: inner.geo.arena_size,
            ..Stats::default()
        };
        for (_, m) in inner.metas(s.blocks) {
            match m.state.load(Relaxed) {
                block_state::FREE => s.free_blocks += 1,
                block_state::LEASED => s.leased_blocks += 1,
                block_state::QUEUED => s.queued_blocks += 1,
                _ => s.writing_blocks += 1,
            }
        }
        s.lanes = inner
            .lanes()
            .filter(|(_, lane)| lane.in_use.load(Relaxed) != 0)
            .count() as u32;
        Ok(s)
    }
}

/// A reserved, not yet published message: fill [`PendingPut::block_mut`],
/// then [`PendingPut::publish`]. Dropped unpublished, the item is withdrawn
/// (its slot becomes a tombstone and its block is freed).
pub struct PendingPut {
    ch: Channel,
    lane: u32,
    r: Option<Reservation>,
    len: usize,
}

impl PendingPut {
    /// The message's bytes in shared memory, `total` long, to fill.
    pub fn block_mut(&mut self) -> &mut [u8] {
        let start = self.r.as_ref().map_or(0, |r| r.start);
        // SAFETY: `reserve` validated [start, start+len) against the arena and
        // the mapping, and the block is exclusively ours while WRITING; the
        // mapping lives as long as `ch`.
        unsafe { std::slice::from_raw_parts_mut(self.ch.inner.map.base().add(start), self.len) }
    }

    /// Length of the message.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the message is empty (never: messages are at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Publishes the message to consumers.
    pub fn publish(mut self) {
        if let Some(r) = self.r.take() {
            self.ch.publish(self.lane, r);
        }
    }
}

impl Drop for PendingPut {
    fn drop(&mut self) {
        if let Some(r) = self.r.take() {
            self.ch.abort(self.lane, r);
        }
    }
}

/// A claimed slot and block, between reserve and publish.
struct Reservation {
    block: u32,
    pos: u64,
    /// Offset of the block in the mapping.
    start: usize,
}

#[derive(Clone, Copy)]
enum TakeRule {
    One,
    Weight(i64),
}

fn lane_key(lane: &Lane) -> Vec<u8> {
    key_from_words(
        lane.key.iter().map(|w| w.load(Relaxed)),
        lane.key_len.load(Relaxed) as usize,
    )
}

/// Checks a mapped header against the file size and recomputes its geometry.
fn validate_header(h: &Header, file_size: u64) -> Result<Geometry> {
    let bad = |m: String| Err(ChannelError::Corrupt(m));
    if h.layout_version.load(Relaxed) != LAYOUT_VERSION {
        return bad(format!(
            "layout version {} (this build reads {LAYOUT_VERSION}); all processes must run the same rlinf-core",
            h.layout_version.load(Relaxed)
        ));
    }
    if h.header_size.load(Relaxed) as usize != size_of::<Header>() {
        return bad("header size mismatch".into());
    }
    let (lanes, cap, blocks) = (
        h.max_lanes.load(Relaxed),
        h.lane_capacity.load(Relaxed),
        h.max_blocks.load(Relaxed),
    );
    if !(1..=MAX_LANES_LIMIT).contains(&lanes)
        || !(1..=MAX_CAPACITY_LIMIT).contains(&cap)
        || !(1..=MAX_BLOCKS_LIMIT).contains(&blocks)
    {
        return bad(format!(
            "geometry out of range: lanes {lanes}, capacity {cap}, blocks {blocks}"
        ));
    }
    let Some(geo) = Geometry::new(lanes, cap, blocks, h.arena_size.load(Relaxed)) else {
        return bad("geometry overflows".into());
    };
    let recorded = (
        h.lanes_off.load(Relaxed),
        h.slots_off.load(Relaxed),
        h.blocks_off.load(Relaxed),
        h.arena_off.load(Relaxed),
        h.total_size.load(Relaxed),
    );
    if recorded
        != (
            geo.lanes_off,
            geo.slots_off,
            geo.blocks_off,
            geo.arena_off,
            geo.total_size,
        )
    {
        return bad("table offsets do not match the geometry".into());
    }
    if geo.total_size != file_size {
        return bad(format!(
            "segment is {file_size} bytes, header says {}",
            geo.total_size
        ));
    }
    Ok(geo)
}

/// Removes segment `name` if no process holds it, no live creator keeps it,
/// and it is fully created (or older than the janitor's grace period).
/// Returns whether it was removed.
fn remove_if_stale(name: &str) -> bool {
    let Ok(fd) = sys::shm_open_existing(name) else {
        return false;
    };
    let header = map_header(&fd);
    let initialised = header
        .as_ref()
        .is_some_and(|m| header_at(m).magic.load(Acquire) == MAGIC);
    let old = std::fs::metadata(format!("{}/{name}", sys::SHM_DIR))
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age >= JANITOR_GRACE);
    (initialised || old)
        && remove_if_last(&fd, name, || {
            header
                .as_ref()
                .is_some_and(|m| claimed_by_creator(header_at(m)))
        })
}

/// Removes segments of `namespace` (or of every namespace) that no live
/// process holds and no live creator keeps. Returns the names removed.
///
/// # Errors
/// If `/dev/shm` cannot be listed.
pub fn cleanup_stale_segments(namespace: Option<&str>) -> Result<Vec<String>> {
    let mut removed = Vec::new();
    for entry in std::fs::read_dir(sys::SHM_DIR)? {
        let Ok(entry) = entry else { continue };
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        let Some((ns, _)) = crate::naming::parse_segment_name(&name) else {
            continue;
        };
        if namespace.is_some_and(|want| want != ns) {
            continue;
        }
        let young = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_none_or(|age| age < JANITOR_GRACE);
        if young {
            continue;
        }
        let Ok(fd) = sys::shm_open_existing(&name) else {
            continue;
        };
        let header = map_header(&fd);
        let claimed = || {
            header
                .as_ref()
                .is_some_and(|m| claimed_by_creator(header_at(m)))
        };
        if remove_if_last(&fd, &name, claimed) {
            removed.push(name);
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_indices_are_refused() {
        let opts = ChannelOptions {
            max_lanes: 4,
            lane_capacity: 8,
            max_blocks: 16,
            arena_bytes: 1 << 20,
            user_tag: 0,
        };
        let ns = format!("rsunit{}", std::process::id());
        let ch = Channel::create(&ns, "bounds", opts).unwrap();
        let inner = &*ch.inner;
        assert!(inner.lane(3).is_ok() && inner.meta(15).is_ok());
        match inner.lane(4) {
            Err(ChannelError::Invalid(m)) => {
                assert!(m.contains("lane index 4") && m.contains("4 lanes"), "{m}")
            }
            other => panic!("lane 4 of 4 was not refused: {:?}", other.map(|_| ())),
        }
        match inner.meta(16) {
            Err(ChannelError::Corrupt(m)) => {
                assert!(
                    m.contains("block index 16") && m.contains("16 blocks"),
                    "{m}"
                )
            }
            other => panic!("block 16 of 16 was not refused: {:?}", other.map(|_| ())),
        }
        assert!(inner.block_range(u32::MAX).is_err());
        // The public calls that take a lane index refuse it too.
        assert!(matches!(ch.qsize(4), Err(ChannelError::Invalid(_))));
        assert!(matches!(
            ch.get(u32::MAX, None, true),
            Err(ChannelError::Invalid(_))
        ));
        assert!(matches!(
            ch.put(9, b"x", &[], 0, None, true),
            Err(ChannelError::Invalid(_))
        ));
    }
}
