package shell

// sysMemfdCreate is memfd_create(2), which the frozen syscall package does not name.
const sysMemfdCreate = 279
