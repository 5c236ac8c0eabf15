//! The codec of every generated client and server: prost's, except that a message that does
//! not decode (a string field that is not UTF-8, a truncated field) is the sender's error,
//! INVALID_ARGUMENT, and not prost's INTERNAL. The status carries an `ErrorInfo` with reason
//! `INVALID_ARGUMENT` in domain `vallum.dev`, as the server's own errors do (its table of
//! reasons: `vallum_server::error::Reason`), and prost's message, which names the field
//! (`ValidateRulesetRequest.ruleset: invalid string value: data is not UTF-8 encoded`).
//!
//! Selected in `build.rs` with `codec_path`: as generated code is one file for clients and
//! servers, a client that receives a reply that does not decode sees INVALID_ARGUMENT too.

use std::marker::PhantomData;

use tonic::Status;
use tonic::codec::{BufferSettings, DecodeBuf};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};
use tonic_types::{ErrorDetails, StatusExt};

/// prost's codec with [`Decoder`] (see the module docs).
#[derive(Debug, Clone)]
pub struct Codec<T, U> {
    prost: ProstCodec<T, U>,
}

impl<T, U> Default for Codec<T, U> {
    fn default() -> Self {
        Codec {
            prost: ProstCodec::default(),
        }
    }
}

impl<T, U> tonic::codec::Codec for Codec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = Decoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        self.prost.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        Decoder {
            prost: self.prost.decoder(),
            _pd: PhantomData,
        }
    }
}

/// The answer to a message that does not decode: INVALID_ARGUMENT, `ErrorInfo` reason
/// `INVALID_ARGUMENT` (domain `vallum.dev`), and prost's `message` (which names the field).
/// Also used by vallumd for services whose code tonic generates with prost's codec (health).
pub fn decode_failed(message: &str) -> Status {
    let mut details = ErrorDetails::new();
    details.set_error_info(
        "INVALID_ARGUMENT",
        "vallum.dev",
        std::collections::HashMap::new(),
    );
    Status::with_error_details(
        tonic::Code::InvalidArgument,
        format!("INVALID_ARGUMENT: {message}"),
        details,
    )
}

/// prost's decoder, its errors answered INVALID_ARGUMENT.
#[derive(Debug, Clone)]
pub struct Decoder<U> {
    prost: ProstDecoder<U>,
    _pd: PhantomData<U>,
}

impl<U: prost::Message + Default> tonic::codec::Decoder for Decoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.prost
            .decode(buf)
            .map_err(|s| decode_failed(s.message()))
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.prost.buffer_settings()
    }
}
