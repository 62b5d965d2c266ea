//! The async face of a tail: a `futures_core::Stream` fed by a thread that runs the
//! blocking [`Tail`](crate::tail::Tail).

use std::pin::Pin;
use std::task::{Context, Poll};

use crate::error::Result;
use crate::event::Event;
use std::path::PathBuf;
use std::sync::Arc;

use crate::log::storage::Storage;
use crate::tail::cursor::Cursor;
use crate::tail::wake::Wake;

/// An async stream of a tail's events, from [`Tail::into_stream`](crate::tail::Tail::into_stream).
///
/// It ends when not following and everything visible at open was delivered, or after
/// yielding an error.
pub struct TailStream {
    pub(super) rx: tokio::sync::mpsc::Receiver<Result<(Event, Cursor)>>,
    pub(super) wake: Arc<Wake>,
    pub(super) storage: Arc<dyn Storage>,
    pub(super) cursor_file: Option<PathBuf>,
    pub(super) cursor_fsync: bool,
    pub(super) last: Option<Cursor>,
    pub(super) committed: Option<Cursor>,
}

impl TailStream {
    /// The cursor of the last event this stream yielded.
    pub fn cursor(&self) -> Option<&Cursor> {
        self.last.as_ref()
    }

    /// Saves the cursor of the last event yielded to the cursor file (see
    /// [`Tail::commit`](crate::tail::Tail::commit)). It does blocking file I/O of about 100 bytes.
    pub fn commit(&mut self) -> Result<()> {
        let (Some(path), Some(c)) = (&self.cursor_file, &self.last) else {
            return Ok(());
        };
        if self.committed.as_ref() == Some(c) {
            return Ok(());
        }
        c.save(&*self.storage, path, self.cursor_fsync)?;
        self.committed = Some(c.clone());
        Ok(())
    }
}

impl futures_core::Stream for TailStream {
    type Item = Result<Event>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Event>>> {
        let this = self.get_mut();
        match this.rx.poll_recv(cx) {
            Poll::Ready(Some(Ok((e, c)))) => {
                this.last = Some(c);
                Poll::Ready(Some(Ok(e)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for TailStream {
    fn drop(&mut self) {
        // Wakes the tail thread out of its wait so that it notices and exits.
        self.wake.close();
    }
}
