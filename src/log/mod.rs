//! The bytes of a run's log: the storage seam every file access goes through, the frame
//! format, segment files, the durable and visible marks in `SYNCED`, and `run.json`.
pub mod frame;
pub mod meta;
pub mod segment;
pub mod storage;
pub mod watermark;
