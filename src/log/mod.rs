//! The bytes of a run's log: the storage seam every file access goes through, the frame
//! format, segment files, the durable and visible marks in `SYNCED`, and `run.json`.
//!
//! - [`storage`]: the `Storage` trait (all I/O: real files, and `MemStorage`, which
//!   keeps separate written and durable images to simulate a power loss at any sync).
//!   The coming second backend plugs in here and in `commit`.
//! - [`frame`]: the byte-exact line format (length + CRC-32 per atomic commit).
//! - [`segment`]: segment naming and listing, and `FrameReader`, the bounded streaming
//!   frame reader every read path uses.
//! - [`watermark`]: the `SYNCED` file: the durable and the visible positions.
//! - [`meta`]: `run.json`, the run's file names, the writer options and durability modes.
//!
//! Invariant: nothing here knows what an event means: frames are checked by CRC and
//! length, never parsed beyond that.
//! Invariant: every file access goes through [`storage::Storage`]; no other module opens
//! a file with `std::fs`.
//! Never imports: anything but `error` and `event` (this is the bottom layer).

pub mod frame;
pub mod meta;
pub mod quarantine;
pub mod segment;
pub mod storage;
pub mod watermark;
