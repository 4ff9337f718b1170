package daemon

// UserNotifyRoot is userNotifyRoot, for the tests of package daemon_test.
const UserNotifyRoot = userNotifyRoot
