//! Local calls: the unary methods of vallumd's gRPC services framed without HTTP/2 on its
//! local unix socket, for `vallum-iptables`, a process per `iptables` command that must start
//! and finish in about a millisecond (issue #33 item 7: an HTTP/2 client with its runtime is
//! most of such a call). The messages are the API's own protobuf messages; vallumd hands each
//! call to the same layers and handlers as a gRPC call (`vallum_server::grpc::local_call`),
//! so this module is only the framing. Our own code because no well-kept crate frames a gRPC
//! call without HTTP/2.
//!
//! A connection opens with [`MAGIC`] (the HTTP/2 preface starts `PRI `, so vallumd tells the
//! two apart by the first byte), then carries calls one after another, each a request frame
//! answered by one response frame. Every frame is a big-endian `u32` length and that many
//! bytes:
//!
//! - request: `u8` path length, the path (`/vallum.v1.RulesetService/EditRuleset`), `u16`
//!   length of the `authorization` value (0: none), the value, then the request message;
//! - response: a `u32` gRPC status code; with 0 (OK) the rest is the response message,
//!   otherwise an encoded `google.rpc.Status` ([`RpcStatus`]: code, message, details) as the
//!   `grpc-status-details-bin` trailer carries it.
//!
//! Sizes: a request frame is at most [`request_frame_limit`] of the server's largest message;
//! a reader checks the declared length against its limit before it allocates.

use prost::Message;

/// The first bytes a client sends on a connection.
pub const MAGIC: &[u8; 8] = b"VALLUM/1";
/// The longest method path.
pub const MAX_PATH: usize = u8::MAX as usize;
/// The longest `authorization` value (as vallumd's HTTP/2 header limit, 16 KiB).
pub const MAX_AUTHORIZATION: usize = 16 << 10;

/// The largest request frame a reader accepts when messages may be `max_message` bytes.
pub const fn request_frame_limit(max_message: usize) -> usize {
    max_message.saturating_add(1 + MAX_PATH + 2 + MAX_AUTHORIZATION)
}

/// Why a frame does not decode.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    /// The frame ends before the field it declares.
    #[error("local call: frame truncated in its {0}")]
    Truncated(&'static str),
    /// The method path is not UTF-8.
    #[error("local call: method path is not UTF-8")]
    Path,
    /// The path or the authorization value is longer than its limit.
    #[error("local call: {0} too long")]
    TooLong(&'static str),
}

/// One request, borrowed from its frame.
#[derive(Debug, PartialEq, Eq)]
pub struct Request<'a> {
    /// The gRPC method path, `/package.Service/Method`.
    pub path: &'a str,
    /// The `authorization` header value (empty: none).
    pub authorization: &'a [u8],
    /// The encoded request message.
    pub message: &'a [u8],
}

/// The request frame (length prefix included) of a call of `path` with `message`.
///
/// Errors: [`FrameError::TooLong`] for a path over [`MAX_PATH`], an authorization over
/// [`MAX_AUTHORIZATION`] or a frame over 4 GiB.
pub fn encode_request(
    path: &str,
    authorization: &[u8],
    message: &impl prost::Message,
) -> Result<Vec<u8>, FrameError> {
    if path.len() > MAX_PATH {
        return Err(FrameError::TooLong("method path"));
    }
    if authorization.len() > MAX_AUTHORIZATION {
        return Err(FrameError::TooLong("authorization"));
    }
    let body = 1 + path.len() + 2 + authorization.len() + message.encoded_len();
    if u32::try_from(body).is_err() {
        return Err(FrameError::TooLong("message"));
    }
    let mut out = Vec::with_capacity(4 + body);
    out.extend_from_slice(&(body as u32).to_be_bytes());
    out.push(path.len() as u8);
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(&(authorization.len() as u16).to_be_bytes());
    out.extend_from_slice(authorization);
    // Encoding into a Vec cannot fail: it grows as needed.
    message.encode_raw(&mut out);
    Ok(out)
}

/// The request of a frame's body (the bytes after the length prefix).
///
/// Errors: [`FrameError`].
pub fn decode_request(body: &[u8]) -> Result<Request<'_>, FrameError> {
    let (&plen, rest) = body.split_first().ok_or(FrameError::Truncated("path"))?;
    let (path, rest) = rest
        .split_at_checked(plen as usize)
        .ok_or(FrameError::Truncated("path"))?;
    let path = std::str::from_utf8(path).map_err(|_| FrameError::Path)?;
    let (alen, rest) = rest
        .split_first_chunk::<2>()
        .ok_or(FrameError::Truncated("authorization"))?;
    let alen = u16::from_be_bytes(*alen) as usize;
    if alen > MAX_AUTHORIZATION {
        return Err(FrameError::TooLong("authorization"));
    }
    let (authorization, message) = rest
        .split_at_checked(alen)
        .ok_or(FrameError::Truncated("authorization"))?;
    Ok(Request {
        path,
        authorization,
        message,
    })
}

/// The response frame (length prefix included) of a call answered with `message` (code 0).
pub fn encode_ok(message: &[u8]) -> Vec<u8> {
    frame(0, message)
}

/// The response frame of a call refused with `status`.
pub fn encode_refusal(status: &RpcStatus) -> Vec<u8> {
    let mut body = Vec::with_capacity(status.encoded_len());
    status.encode_raw(&mut body);
    frame(status.code as u32, &body)
}

fn frame(code: u32, rest: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + rest.len());
    out.extend_from_slice(&((4 + rest.len()) as u32).to_be_bytes());
    out.extend_from_slice(&code.to_be_bytes());
    out.extend_from_slice(rest);
    out
}

/// A response frame's body: `Ok(message bytes)`, or the refusal.
///
/// Errors: [`FrameError::Truncated`] without a code; a refusal whose status does not decode
/// keeps its code with the message "undecodable status".
pub fn decode_response(body: &[u8]) -> Result<Result<&[u8], RpcStatus>, FrameError> {
    let (code, rest) = body
        .split_first_chunk::<4>()
        .ok_or(FrameError::Truncated("status code"))?;
    let code = u32::from_be_bytes(*code);
    if code == 0 {
        return Ok(Ok(rest));
    }
    let mut status = RpcStatus::decode(rest).unwrap_or_else(|_| RpcStatus {
        message: "undecodable status".to_owned(),
        ..RpcStatus::default()
    });
    status.code = code as i32;
    Ok(Err(status))
}

/// `google.rpc.Status` (google/rpc/status.proto), the body of a refusal.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RpcStatus {
    /// The gRPC status code.
    #[prost(int32, tag = "1")]
    pub code: i32,
    /// The message, as `grpc-message` carries it.
    #[prost(string, tag = "2")]
    pub message: String,
    /// The error details (`ErrorInfo`, `BadRequest`, ...).
    #[prost(message, repeated, tag = "3")]
    pub details: Vec<prost_types::Any>,
}

/// `google.rpc.ErrorInfo` (google/rpc/error_details.proto): the reason of a refusal.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ErrorInfo {
    /// UPPER_SNAKE reason (vallumd's table of reasons).
    #[prost(string, tag = "1")]
    pub reason: String,
    /// `vallum.dev`.
    #[prost(string, tag = "2")]
    pub domain: String,
}

/// `google.rpc.BadRequest`: which request fields were wrong.
#[derive(Clone, PartialEq, prost::Message)]
pub struct BadRequest {
    /// One per wrong field.
    #[prost(message, repeated, tag = "1")]
    pub field_violations: Vec<FieldViolation>,
}

/// `google.rpc.BadRequest.FieldViolation`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct FieldViolation {
    /// The field path (`edits[0].args`).
    #[prost(string, tag = "1")]
    pub field: String,
    /// What is wrong with it.
    #[prost(string, tag = "2")]
    pub description: String,
}

/// `type_url` of [`ErrorInfo`] in [`RpcStatus::details`].
pub const ERROR_INFO_TYPE: &str = "type.googleapis.com/google.rpc.ErrorInfo";
/// `type_url` of [`BadRequest`] in [`RpcStatus::details`].
pub const BAD_REQUEST_TYPE: &str = "type.googleapis.com/google.rpc.BadRequest";

impl RpcStatus {
    /// The first detail of `type_url`, decoded as `M`.
    pub fn detail<M: prost::Message + Default>(&self, type_url: &str) -> Option<M> {
        let any = self.details.iter().find(|a| a.type_url == type_url)?;
        M::decode(any.value.as_slice()).ok()
    }

    /// The `ErrorInfo.reason` of the refusal, if it has one.
    pub fn reason(&self) -> Option<String> {
        self.detail::<ErrorInfo>(ERROR_INFO_TYPE).map(|i| i.reason)
    }

    /// The description of the first field violation, if any.
    pub fn first_violation(&self) -> Option<String> {
        let b = self.detail::<BadRequest>(BAD_REQUEST_TYPE)?;
        b.field_violations.into_iter().next().map(|v| v.description)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trip_and_bounds() {
        let msg = RpcStatus {
            code: 3,
            message: "m".into(),
            details: vec![],
        };
        let f = encode_request("/a.B/C", b"Bearer t", &msg).unwrap();
        let len = u32::from_be_bytes(f[..4].try_into().unwrap()) as usize;
        assert_eq!(len, f.len() - 4);
        let r = decode_request(&f[4..]).unwrap();
        assert_eq!(r.path, "/a.B/C");
        assert_eq!(r.authorization, b"Bearer t");
        assert_eq!(RpcStatus::decode(r.message).unwrap(), msg);
        // Every truncation is an error, never a panic.
        for n in 0..f.len() - 4 - r.message.len() {
            assert!(decode_request(&f[4..4 + n]).is_err(), "prefix of {n} bytes");
        }
        let long = "x".repeat(MAX_PATH + 1);
        assert_eq!(
            encode_request(&long, b"", &msg),
            Err(FrameError::TooLong("method path"))
        );
        assert!(request_frame_limit(usize::MAX) == usize::MAX);
    }

    #[test]
    fn responses() {
        let ok = encode_ok(b"abc");
        assert_eq!(decode_response(&ok[4..]).unwrap(), Ok(&b"abc"[..]));
        let info = ErrorInfo {
            reason: "NOT_READY".into(),
            domain: "vallum.dev".into(),
        };
        let bad = BadRequest {
            field_violations: vec![FieldViolation {
                field: "edits[0]".into(),
                description: "no chain X".into(),
            }],
        };
        let st = RpcStatus {
            code: 14,
            message: "still loading".into(),
            details: vec![
                prost_types::Any {
                    type_url: ERROR_INFO_TYPE.into(),
                    value: info.encode_to_vec(),
                },
                prost_types::Any {
                    type_url: BAD_REQUEST_TYPE.into(),
                    value: bad.encode_to_vec(),
                },
            ],
        };
        let f = encode_refusal(&st);
        let back = decode_response(&f[4..]).unwrap().unwrap_err();
        assert_eq!(back, st);
        assert_eq!(back.reason().as_deref(), Some("NOT_READY"));
        assert_eq!(back.first_violation().as_deref(), Some("no chain X"));
        assert_eq!(
            decode_response(&[0, 0]),
            Err(FrameError::Truncated("status code"))
        );
    }
}
