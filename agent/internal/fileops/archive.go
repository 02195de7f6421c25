package fileops

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/bzip2"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// opDownload writes a tar of a file or tree; FIFOs, sockets and devices are left out
// (a copy has no use for them).
func opDownload(req DownloadRequest, o *out) (DownloadResult, error) {
	path := strings.TrimRight(req.Path, "/")
	if path == "" {
		path = "/"
	}
	if req.Follow {
		if resolved, err := filepath.EvalSymlinks(path); err == nil {
			path = resolved
		}
	}
	if _, err := os.Lstat(path); err != nil {
		return DownloadResult{}, fromOS(err, path)
	}
	w := &dataWriter{o: o}
	archive := tar.NewWriter(w)
	base := filepath.Base(path)
	if base == "/" || base == "." {
		base = "root"
	}
	links := map[[2]uint64]string{} // (dev, inode) -> first name: later ones are hard links
	err := filepath.Walk(path, func(name string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(path, name)
		arcname := base
		if rel != "." {
			arcname = base + "/" + filepath.ToSlash(rel)
		}
		return addEntry(archive, name, arcname, info, links)
	})
	if err != nil {
		return DownloadResult{}, fromOS(err, path)
	}
	if err := archive.Close(); err != nil {
		return DownloadResult{}, fromOS(err, path)
	}
	w.flush()
	return DownloadResult{}, nil
}

func addEntry(archive *tar.Writer, name, arcname string, info os.FileInfo, links map[[2]uint64]string) error {
	mode := info.Mode()
	if !(mode.IsRegular() || mode.IsDir() || mode&os.ModeSymlink != 0) {
		return nil
	}
	target := ""
	if mode&os.ModeSymlink != 0 {
		var err error
		if target, err = os.Readlink(name); err != nil {
			return err
		}
	}
	header, err := tar.FileInfoHeader(info, target)
	if err != nil {
		return err
	}
	header.Name = arcname
	header.Format = tar.FormatPAX
	if mode.IsDir() {
		header.Name += "/"
	}
	if st, ok := info.Sys().(*syscall.Stat_t); ok && mode.IsRegular() && st.Nlink > 1 {
		key := [2]uint64{uint64(st.Dev), uint64(st.Ino)}
		if first, seen := links[key]; seen {
			header.Typeflag, header.Linkname, header.Size = tar.TypeLink, first, 0
		} else {
			links[key] = arcname
		}
	}
	if err := archive.WriteHeader(header); err != nil {
		return err
	}
	if header.Typeflag != tar.TypeReg {
		return nil
	}
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	// Exactly the size in the header: a file that grows meanwhile must not break the archive.
	_, err = io.CopyN(archive, f, header.Size)
	if errors.Is(err, io.EOF) {
		return fmt.Errorf("%s shrank while being copied", name)
	}
	return err
}

// safeName normalises an archive member's name; it refuses one that is absolute, climbs,
// or (unless rootOK) is empty.
func safeName(name string, rootOK bool) (string, error) {
	var parts []string
	for _, p := range strings.Split(name, "/") {
		if p != "" && p != "." {
			parts = append(parts, p)
		}
	}
	climbs := false
	for _, p := range parts {
		if p == ".." {
			climbs = true
		}
	}
	if strings.HasPrefix(name, "/") || climbs || (len(parts) == 0 && !rootOK) {
		return "", opErr("invalid", "unsafe path in archive: %s", quote(name))
	}
	return strings.Join(parts, "/"), nil
}

func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "\\'") + "'" }

// inside is where member name goes under root; it refuses a name that passes through a
// symlink (one from the archive, or already there, would carry later members outside root).
func inside(root, name string) (string, error) {
	clean, err := safeName(name, false)
	if err != nil {
		return "", err
	}
	parts := strings.Split(clean, "/")
	for depth := 1; depth < len(parts); depth++ {
		if info, err := os.Lstat(filepath.Join(root, filepath.Join(parts[:depth]...))); err == nil && info.Mode()&os.ModeSymlink != 0 {
			return "", opErr("invalid", "unsafe path in archive: %s goes through a symlink", quote(clean))
		}
	}
	return filepath.Join(root, clean), nil
}

// decompress recognises gzip and bzip2 streams, as tar's "r|*" does; others are plain.
func decompress(r *bufio.Reader) (io.Reader, error) {
	head, _ := r.Peek(3)
	switch {
	case bytes.HasPrefix(head, []byte{0x1f, 0x8b}):
		return gzip.NewReader(r)
	case bytes.HasPrefix(head, []byte("BZh")):
		return bzip2.NewReader(r), nil
	case bytes.HasPrefix(head, []byte{0xfd, '7', 'z'}):
		return nil, opErr("invalid", "not a valid tar stream: xz-compressed archives are not read; send it uncompressed or gzipped")
	}
	return r, nil
}

// notTar is the error of a stream that is no tar archive (an OpError from the data's
// source, such as a cut-off stream, stays as it is).
func notTar(err error) error {
	var op *OpError
	if errors.As(err, &op) {
		return op
	}
	return opErr("invalid", "not a valid tar stream: %v", err)
}

// opUpload extracts a tar stream from stdin into a directory, refusing names that leave it.
func opUpload(req UploadRequest, o *out) (UploadResult, error) {
	root := req.Path
	if err := os.MkdirAll(root, 0o777); err != nil {
		return UploadResult{}, fromOS(err, root)
	}
	stream, err := decompress(bufio.NewReaderSize(&in{r: o.input}, 64<<10))
	if err != nil {
		return UploadResult{}, notTar(err)
	}
	archive := tar.NewReader(stream)
	var result UploadResult
	for {
		header, err := archive.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return UploadResult{}, notTar(err)
		}
		if header.Typeflag == tar.TypeDir && !strings.HasPrefix(header.Name, "/") {
			if clean, _ := safeName(header.Name, true); clean == "" {
				continue // "./": the directory being extracted into (`tar -C src -cf - .` starts so)
			}
		}
		target, err := inside(root, header.Name)
		if err != nil {
			return UploadResult{}, err
		}
		extracted, size, err := extract(archive, header, root, target)
		if err != nil {
			return UploadResult{}, err
		}
		result.Size += size
		if extracted {
			result.Entries++
		}
	}
	return result, nil
}

// extract writes one archive member (header, its data next in archive) at target, inside
// root. It says whether the member was extracted (devices and FIFOs are not) and how many
// bytes of a regular file it wrote (also when that failed part way).
func extract(archive *tar.Reader, header *tar.Header, root, target string) (bool, int64, error) {
	mode := os.FileMode(header.Mode & 0o777)
	switch header.Typeflag {
	case tar.TypeDir:
		if err := os.MkdirAll(target, 0o777); err != nil {
			return false, 0, fromOS(err, target)
		}
		if err := os.Chmod(target, mode|0o700); err != nil {
			return false, 0, fromOS(err, target)
		}
	case tar.TypeReg, tar.TypeRegA:
		size, err := extractFile(archive, header, target, mode)
		return err == nil, size, err
	case tar.TypeSymlink:
		if err := os.MkdirAll(filepath.Dir(target), 0o777); err != nil {
			return false, 0, fromOS(err, target)
		}
		if _, err := os.Lstat(target); err == nil {
			_ = os.Remove(target)
		}
		if err := os.Symlink(header.Linkname, target); err != nil {
			return false, 0, fromOS(err, target)
		}
	case tar.TypeLink:
		source, err := inside(root, header.Linkname)
		if err != nil {
			return false, 0, err
		}
		if err := os.MkdirAll(filepath.Dir(target), 0o777); err != nil {
			return false, 0, fromOS(err, target)
		}
		if err := os.Link(source, target); err != nil {
			return false, 0, fromOS(err, target)
		}
	default:
		return false, 0, nil // devices and fifos are not extracted
	}
	return true, 0, nil
}

// extractFile writes a regular member's data to target (never through a symlink there). The
// data goes to a temporary file beside it, renamed over target once whole: an archive cut
// short (its sender failed or went away) leaves no half-written file, and target as it was.
func extractFile(archive *tar.Reader, header *tar.Header, target string, mode os.FileMode) (int64, error) {
	dir := filepath.Dir(target)
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return 0, fromOS(err, target)
	}
	f, err := os.CreateTemp(dir, ".sandboxd-upload-*.tmp")
	if err != nil {
		return 0, fromOS(err, target)
	}
	stage(f.Name()) // a helper ended meanwhile (its upload cancelled) removes it
	defer stage("")
	n, err := io.Copy(f, archive)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), mode)
	}
	if err == nil {
		err = os.Rename(f.Name(), target) // replaces a symlink at target, never follows it
	}
	if err != nil {
		_ = os.Remove(f.Name())
		var op *OpError
		if errors.As(err, &op) {
			return n, op
		}
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return n, opErr("invalid", "not a valid tar stream: %s is cut short", header.Name)
		}
		return n, fromOS(err, target)
	}
	return n, nil
}

// opFetch GETs an http(s) URL from inside the workspace, so its network policy applies.
func opFetch(req FetchRequest, o *out) (FetchResult, error) {
	url, maxBytes := req.URL, int64(req.MaxBytes)
	timeout := 30 * time.Second
	if req.TimeoutS > 0 {
		timeout = time.Duration(req.TimeoutS * float64(time.Second))
	}
	client := &http.Client{Timeout: timeout}
	response, err := client.Get(url)
	if err != nil {
		return FetchResult{}, opErr("network", "cannot fetch %s: %v", url, err)
	}
	defer response.Body.Close()
	if response.StatusCode >= 400 {
		return FetchResult{}, opErr("network", "cannot fetch %s: HTTP Error %d: %s", url, response.StatusCode, http.StatusText(response.StatusCode))
	}
	var total int64
	buf := make([]byte, chunk)
	for {
		n, err := response.Body.Read(buf)
		if n > 0 {
			total += int64(n)
			if total > maxBytes {
				return FetchResult{}, opErr("too_large", "%s is larger than %s bytes", url, strconv.FormatInt(maxBytes, 10))
			}
			o.send('D', buf[:n])
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return FetchResult{}, opErr("network", "cannot fetch %s: %v", url, err)
		}
	}
	return FetchResult{Size: total, ContentType: response.Header.Get("Content-Type")}, nil
}
