//! The raw PJRT calls of a deviceless compile, over `pjrt-sys`'s bindings.
//!
//! The `pjrt` crate covers the execution path, but its compile path cannot serve here: it
//! hides the executable's pointer and sends `PJRT_Executable_GetCompiledMemoryStats` the
//! 0.54 struct (104 bytes), which libtpu 0.0.42.1 (API 0.112: `peak_memory_in_bytes`
//! appended) refuses. So this module calls the C API itself: plugin load and initialize,
//! topology, compile, memory stats (the 0.112 struct), code size, serialize, errors.
//! Every `unsafe` block is a call through libtpu's function table with an argument struct
//! built here, or a read of memory libtpu returned for the length it gave.
#![allow(unsafe_code)]

use pjrt_sys as sys;
use std::path::Path;
use std::ptr;

/// A loaded and initialized PJRT plugin: its function table, and the library kept open.
pub struct Plugin {
    api: *const sys::PJRT_Api,
    _lib: libloading::Library,
}

/// Call the table entry `$f` with `$args`; a PJRT error becomes its message.
macro_rules! call {
    ($plugin:expr, $f:ident, $args:expr) => {{
        let f = unsafe { (*$plugin.api).$f }.ok_or(concat!("the plugin has no ", stringify!($f)))?;
        // SAFETY: `$args` is a fully initialized argument struct of `$f` with its
        // `struct_size` set; pointers in it outlive the call.
        let err = unsafe { f($args) };
        $plugin.check(err, stringify!($f))?
    }};
}

impl Plugin {
    /// `dlopen` the plugin, `GetPjrtApi`, `PJRT_Plugin_Initialize`.
    pub fn load(path: &Path) -> Result<Plugin, String> {
        // SAFETY: loading a PJRT plugin runs its initializers; that is what it is for.
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| format!("cannot load {}: {e}", path.display()))?;
        // SAFETY: `GetPjrtApi` has this signature in every PJRT plugin.
        let get: libloading::Symbol<unsafe extern "C" fn() -> *const sys::PJRT_Api> =
            unsafe { lib.get(b"GetPjrtApi") }.map_err(|e| format!("{} exports no GetPjrtApi: {e}", path.display()))?;
        // SAFETY: returns a pointer to the plugin's static function table.
        let api = unsafe { get() };
        if api.is_null() {
            return Err(format!("{}: GetPjrtApi returned null", path.display()));
        }
        let plugin = Plugin { api, _lib: lib };
        let mut args = sys::PJRT_Plugin_Initialize_Args::new();
        call!(plugin, PJRT_Plugin_Initialize, &mut args);
        Ok(plugin)
    }

    /// `Ok` for a null error; else the error's message and code (and the error freed).
    fn check(&self, err: *mut sys::PJRT_Error, what: &str) -> Result<(), String> {
        if err.is_null() {
            return Ok(());
        }
        let mut m = sys::PJRT_Error_Message_Args::new();
        m.error = err;
        // SAFETY: `err` is a live error from the plugin; the message lives until it is destroyed.
        let message = unsafe {
            if let Some(f) = (*self.api).PJRT_Error_Message {
                f(&mut m);
                String::from_utf8_lossy(std::slice::from_raw_parts(m.message as *const u8, m.message_size)).into_owned()
            } else {
                "(no message)".into()
            }
        };
        let mut d = sys::PJRT_Error_Destroy_Args::new();
        d.error = err;
        // SAFETY: destroys the error once.
        unsafe {
            if let Some(f) = (*self.api).PJRT_Error_Destroy {
                f(&mut d);
            }
        }
        Err(if message.is_empty() { format!("{what} failed") } else { message })
    }

    /// `PJRT_TopologyDescription_Create(name)`.
    pub fn topology(&self, name: &str) -> Result<Topology<'_>, String> {
        let mut args = sys::PJRT_TopologyDescription_Create_Args::new();
        args.topology_name = name.as_ptr() as *const _;
        args.topology_name_size = name.len();
        call!(self, PJRT_TopologyDescription_Create, &mut args);
        Ok(Topology { plugin: self, ptr: args.topology })
    }

    /// `PJRT_Compile` of an MLIR program for `topology`, without a client.
    pub fn compile(&self, program: &[u8], topology: &Topology<'_>, options: &[u8]) -> Result<Executable<'_>, String> {
        let format = b"mlir";
        let mut prog = sys::PJRT_Program::new();
        prog.code = program.as_ptr() as *mut _;
        prog.code_size = program.len();
        prog.format = format.as_ptr() as *const _;
        prog.format_size = format.len();
        let mut args = sys::PJRT_Compile_Args::new();
        args.topology = topology.ptr;
        args.program = &prog;
        args.compile_options = options.as_ptr() as *const _;
        args.compile_options_size = options.len();
        call!(self, PJRT_Compile, &mut args);
        Ok(Executable { plugin: self, ptr: args.executable })
    }
}

pub struct Topology<'p> {
    plugin: &'p Plugin,
    ptr: *mut sys::PJRT_TopologyDescription,
}

impl Drop for Topology<'_> {
    fn drop(&mut self) {
        let mut args = sys::PJRT_TopologyDescription_Destroy_Args::new();
        args.topology = self.ptr;
        let mut destroy = || -> Result<(), String> {
            call!(self.plugin, PJRT_TopologyDescription_Destroy, &mut args);
            Ok(())
        };
        let _ = destroy();
    }
}

/// `PJRT_Executable_GetCompiledMemoryStats_Args` as of PJRT C API 0.112: the 0.54 struct
/// plus `peak_memory_in_bytes` (libtpu rejects the shorter one).
#[repr(C)]
struct MemoryStatsArgs {
    struct_size: usize,
    extension_start: *mut sys::PJRT_Extension_Base,
    executable: *mut sys::PJRT_Executable,
    generated_code_size_in_bytes: i64,
    argument_size_in_bytes: i64,
    output_size_in_bytes: i64,
    alias_size_in_bytes: i64,
    temp_size_in_bytes: i64,
    host_generated_code_size_in_bytes: i64,
    host_argument_size_in_bytes: i64,
    host_output_size_in_bytes: i64,
    host_alias_size_in_bytes: i64,
    host_temp_size_in_bytes: i64,
    peak_memory_in_bytes: i64,
}

/// Device-memory figures of a compiled executable.
#[derive(Clone, Copy, Debug)]
pub struct MemoryStats {
    pub generated_code_size_in_bytes: i64,
    pub argument_size_in_bytes: i64,
    pub output_size_in_bytes: i64,
    pub alias_size_in_bytes: i64,
    pub temp_size_in_bytes: i64,
    pub peak_memory_in_bytes: i64,
}

pub struct Executable<'p> {
    plugin: &'p Plugin,
    ptr: *mut sys::PJRT_Executable,
}

impl Executable<'_> {
    pub fn memory_stats(&self) -> Result<MemoryStats, String> {
        let mut args = MemoryStatsArgs {
            struct_size: std::mem::size_of::<MemoryStatsArgs>(),
            extension_start: ptr::null_mut(),
            executable: self.ptr,
            generated_code_size_in_bytes: 0,
            argument_size_in_bytes: 0,
            output_size_in_bytes: 0,
            alias_size_in_bytes: 0,
            temp_size_in_bytes: 0,
            host_generated_code_size_in_bytes: 0,
            host_argument_size_in_bytes: 0,
            host_output_size_in_bytes: 0,
            host_alias_size_in_bytes: 0,
            host_temp_size_in_bytes: 0,
            peak_memory_in_bytes: 0,
        };
        let args_ptr = (&mut args as *mut MemoryStatsArgs).cast::<sys::PJRT_Executable_GetCompiledMemoryStats_Args>();
        call!(self.plugin, PJRT_Executable_GetCompiledMemoryStats, args_ptr);
        Ok(MemoryStats {
            generated_code_size_in_bytes: args.generated_code_size_in_bytes,
            argument_size_in_bytes: args.argument_size_in_bytes,
            output_size_in_bytes: args.output_size_in_bytes,
            alias_size_in_bytes: args.alias_size_in_bytes,
            temp_size_in_bytes: args.temp_size_in_bytes,
            peak_memory_in_bytes: args.peak_memory_in_bytes,
        })
    }

    /// `PJRT_Executable_Serialize`: the bytes, copied out (and libtpu's copy freed).
    pub fn serialize(&self) -> Result<Vec<u8>, String> {
        let mut args = sys::PJRT_Executable_Serialize_Args::new();
        args.executable = self.ptr;
        call!(self.plugin, PJRT_Executable_Serialize, &mut args);
        // SAFETY: libtpu returned `serialized_bytes_size` bytes, alive until the deleter runs.
        let bytes = unsafe { std::slice::from_raw_parts(args.serialized_bytes as *const u8, args.serialized_bytes_size) }.to_vec();
        if let Some(deleter) = args.serialized_executable_deleter {
            // SAFETY: called once, on the object libtpu gave with it.
            unsafe { deleter(args.serialized_executable) };
        }
        Ok(bytes)
    }
}

impl Drop for Executable<'_> {
    fn drop(&mut self) {
        let mut args = sys::PJRT_Executable_Destroy_Args::new();
        args.executable = self.ptr;
        let mut destroy = || -> Result<(), String> {
            call!(self.plugin, PJRT_Executable_Destroy, &mut args);
            Ok(())
        };
        let _ = destroy();
    }
}
