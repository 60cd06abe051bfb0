//! tcpkit-wire's integration tests, linked into one test binary: each file here is a module of
//! it.

mod corpus;
mod tcprewrite;
