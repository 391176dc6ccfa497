//! Host-side operations around the graphs: pure functions over slices, no QNN types.

pub mod convert;
pub mod embed;
pub mod mask;
pub mod rope;
