//! `shoal-client`: producer, push consumer, lite pull consumer and admin client.

pub mod admin;
pub mod fault;
pub mod offset_store;
pub mod process_queue;
