//! Cutting a watch body into events: JSON lines, or protobuf frames (a 4-byte big-endian
//! length, then that many bytes), out of the chunks the connection delivers, whatever their
//! boundaries.
//!
//! Whatever the bytes, this never panics: a frame longer than [`MAX_FRAME`] (client-go's limit)
//! or a body that ends inside a frame is a [`FrameError`], which the client reports as a decode
//! error (and the reflector answers with a fresh list).

use bytes::{Buf, Bytes, BytesMut};

/// The longest frame accepted, as client-go's protobuf watch decoder: 16 MiB.
pub const MAX_FRAME: usize = 16 * 1024 * 1024;

/// How a watch body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// One JSON event per line.
    Lines,
    /// Length-prefixed protobuf frames.
    LengthPrefixed,
}

/// A body that cannot be cut into frames.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// A frame announced (or, for lines, reached) more than [`MAX_FRAME`] bytes.
    #[error("a watch frame of {0} bytes is over the {MAX_FRAME}-byte limit")]
    TooLong(usize),
    /// The body ended inside a frame.
    #[error("the watch body ended inside a frame ({0} bytes of it received)")]
    Truncated(usize),
}

/// Collects a body's chunks and hands out whole frames.
#[derive(Debug)]
pub struct Frames {
    framing: Framing,
    buffer: BytesMut,
    /// For lines: how far the buffer was already searched for a newline.
    searched: usize,
}

impl Frames {
    /// An empty reader.
    pub fn new(framing: Framing) -> Self {
        Self {
            framing,
            buffer: BytesMut::new(),
            searched: 0,
        }
    }

    /// Adds a chunk of the body.
    pub fn push(&mut self, chunk: &[u8]) {
        self.buffer.extend_from_slice(chunk);
    }

    /// The next whole frame, if the buffer holds one (without its length prefix or newline;
    /// empty lines are skipped).
    pub fn next_frame(&mut self) -> Result<Option<Bytes>, FrameError> {
        match self.framing {
            Framing::LengthPrefixed => {
                if self.buffer.len() < 4 {
                    return Ok(None);
                }
                let len = u32::from_be_bytes([
                    self.buffer[0],
                    self.buffer[1],
                    self.buffer[2],
                    self.buffer[3],
                ]) as usize;
                if len > MAX_FRAME {
                    return Err(FrameError::TooLong(len));
                }
                if self.buffer.len() < 4 + len {
                    return Ok(None);
                }
                self.buffer.advance(4);
                Ok(Some(self.buffer.split_to(len).freeze()))
            }
            Framing::Lines => loop {
                let from = self.searched;
                match self.buffer[from..].iter().position(|&b| b == b'\n') {
                    Some(at) => {
                        let line = self.buffer.split_to(from + at + 1);
                        self.searched = 0;
                        let line = line.freeze().slice(..from + at);
                        if line.iter().all(u8::is_ascii_whitespace) {
                            continue;
                        }
                        return Ok(Some(line));
                    }
                    None => {
                        self.searched = self.buffer.len();
                        if self.buffer.len() > MAX_FRAME {
                            return Err(FrameError::TooLong(self.buffer.len()));
                        }
                        return Ok(None);
                    }
                }
            },
        }
    }

    /// The body ended: what is left must be nothing (or, for lines, one last line without
    /// its newline).
    pub fn finish(&mut self) -> Result<Option<Bytes>, FrameError> {
        let rest = std::mem::take(&mut self.buffer);
        self.searched = 0;
        match self.framing {
            _ if rest.iter().all(u8::is_ascii_whitespace) => Ok(None),
            Framing::Lines => Ok(Some(rest.freeze())),
            Framing::LengthPrefixed => Err(FrameError::Truncated(rest.len())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn framed(frames: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        for f in frames {
            out.extend_from_slice(&(f.len() as u32).to_be_bytes());
            out.extend_from_slice(f);
        }
        out
    }

    fn cut(framing: Framing, body: &[u8], sizes: &[usize]) -> Result<Vec<Bytes>, FrameError> {
        let mut frames = Frames::new(framing);
        let mut out = Vec::new();
        let mut rest = body;
        let mut sizes = sizes.iter().cycle();
        while !rest.is_empty() {
            let n = (*sizes.next().unwrap()).clamp(1, rest.len());
            frames.push(&rest[..n]);
            rest = &rest[n..];
            while let Some(f) = frames.next_frame()? {
                out.push(f);
            }
        }
        out.extend(frames.finish()?);
        Ok(out)
    }

    proptest! {
        #[test]
        fn frames_come_out_whole_whatever_the_chunks(
            frames in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..20),
            sizes in proptest::collection::vec(1usize..64, 1..8),
        ) {
            let got = cut(Framing::LengthPrefixed, &framed(&frames), &sizes).unwrap();
            prop_assert_eq!(got.iter().map(|b| b.to_vec()).collect::<Vec<_>>(), frames);
        }

        #[test]
        fn lines_come_out_whole_whatever_the_chunks(
            lines in proptest::collection::vec("[a-z{}:,]{1,80}", 0..20),
            sizes in proptest::collection::vec(1usize..64, 1..8),
            last_newline: bool,
        ) {
            let mut body = lines.join("\n");
            if last_newline { body.push('\n'); }
            let got = cut(Framing::Lines, body.as_bytes(), &sizes).unwrap();
            let got: Vec<String> = got.iter().map(|b| String::from_utf8(b.to_vec()).unwrap()).collect();
            prop_assert_eq!(got, lines);
        }

        #[test]
        fn any_bytes_give_frames_or_an_error_never_a_panic(
            body in proptest::collection::vec(any::<u8>(), 0..2000),
            sizes in proptest::collection::vec(1usize..64, 1..8),
        ) {
            let _ = cut(Framing::LengthPrefixed, &body, &sizes);
            let _ = cut(Framing::Lines, &body, &sizes);
        }
    }

    #[test]
    fn a_truncated_frame_is_an_error() {
        let mut body = framed(&[b"whole".to_vec(), b"cut short".to_vec()]);
        body.truncate(body.len() - 3);
        assert_eq!(
            cut(Framing::LengthPrefixed, &body, &[7]),
            Err(FrameError::Truncated(10))
        );
    }

    #[test]
    fn an_oversized_frame_is_refused_before_it_is_read() {
        let mut frames = Frames::new(Framing::LengthPrefixed);
        frames.push(&((MAX_FRAME + 1) as u32).to_be_bytes());
        assert_eq!(frames.next_frame(), Err(FrameError::TooLong(MAX_FRAME + 1)));
        let mut frames = Frames::new(Framing::LengthPrefixed);
        frames.push(&(MAX_FRAME as u32).to_be_bytes());
        assert_eq!(frames.next_frame(), Ok(None), "exactly the limit is fine");
    }

    #[test]
    fn an_endless_line_is_refused() {
        let mut frames = Frames::new(Framing::Lines);
        frames.push(&vec![b'x'; MAX_FRAME + 1]);
        assert_eq!(frames.next_frame(), Err(FrameError::TooLong(MAX_FRAME + 1)));
    }
}
