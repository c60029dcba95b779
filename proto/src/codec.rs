//! The codec of every chorus service: prost, except that a request that does
//! not decode (bad wire format, invalid UTF-8 in a string) is the caller's
//! mistake — `INVALID_ARGUMENT` — rather than tonic's default `INTERNAL`.

use std::marker::PhantomData;

use prost::Message;
use tonic::{
    Status,
    codec::{Codec, DecodeBuf, Decoder},
};
use tonic_prost::{ProstCodec, ProstEncoder};

/// Encodes with prost; decodes with prost and reports bad input as such.
#[derive(Debug, Clone, Copy)]
pub struct ChorusCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for ChorusCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for ChorusCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ChorusDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::default().encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        ChorusDecoder(PhantomData)
    }
}

/// Decodes a `U`, or fails with `INVALID_ARGUMENT` naming what was wrong.
#[derive(Debug, Clone, Copy)]
pub struct ChorusDecoder<U>(PhantomData<U>);

impl<U: Message + Default> Decoder for ChorusDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf).map(Some).map_err(|error| Status::invalid_argument(format!("malformed message: {error}")))
    }
}
