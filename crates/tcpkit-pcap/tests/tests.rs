//! The pcap reader's and writers' integration tests, linked into one test binary: each file here
//! is a module of it.

mod common;

mod corpus;
mod formats;
mod testdata;
