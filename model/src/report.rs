impl crate::ModelSpec { pub fn report(&self) -> String { String::new() } }
