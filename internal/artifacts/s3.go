package artifacts

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// S3Backend keeps objects in an S3-compatible bucket under a key prefix. S3 writes are atomic per
// object and reads after writes are consistent, which is all the store needs.
type S3Backend struct {
	client *s3.Client
	bucket string
	prefix string // "" or ending in "/"
	name   string
}

// OpenS3 opens s3://bucket/prefix. The endpoint, region and credentials come the usual AWS way:
// AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL (or endpoint_url in the shared config), AWS_REGION
// (us-east-1 when none is set), and the default credentials chain (AWS_ACCESS_KEY_ID and
// AWS_SECRET_ACCESS_KEY, AWS_PROFILE, web identity, instance roles). The query parameter
// addressing=path|virtual chooses the addressing style; the default is path-style when an
// endpoint is configured (SeaweedFS, MinIO and most self-hosted servers) and virtual-hosted
// otherwise (AWS). The bucket must exist.
func OpenS3(ctx context.Context, rawURL string) (*S3Backend, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "s3" || u.Host == "" {
		return nil, fmt.Errorf("artifacts: store %q: want s3://bucket/prefix", rawURL)
	}
	addressing := "auto"
	for k, v := range u.Query() {
		switch {
		case k == "addressing" && len(v) == 1 && (v[0] == "path" || v[0] == "virtual" || v[0] == "auto"):
			addressing = v[0]
		default:
			return nil, fmt.Errorf("artifacts: store %q: unknown parameter %q (only addressing=path|virtual|auto)", rawURL, k)
		}
	}
	prefix := strings.Trim(u.Path, "/")
	if prefix != "" {
		if err := checkKey(prefix); err != nil {
			return nil, fmt.Errorf("artifacts: store %q: bad prefix: %w", rawURL, err)
		}
		prefix += "/"
	}
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, fmt.Errorf("artifacts: store %q: AWS config: %w", rawURL, err)
	}
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	// The SDK's default keeps 10 idle connections per host; a push or pull runs more requests
	// than that at once, and redialing each time costs more than the request on a LAN.
	cfg.HTTPClient = awshttp.NewBuildableClient().WithTransportOptions(func(t *http.Transport) {
		t.MaxIdleConnsPerHost = 64
	})
	client := s3.NewFromConfig(cfg, func(o *s3.Options) {
		switch addressing {
		case "path":
			o.UsePathStyle = true
		case "auto":
			o.UsePathStyle = o.BaseEndpoint != nil
		}
	})
	return &S3Backend{client: client, bucket: u.Host, prefix: prefix, name: "s3://" + u.Host + "/" + prefix}, nil
}

func (b *S3Backend) String() string { return b.name }

func (b *S3Backend) key(key string) (string, error) {
	if err := checkKey(key); err != nil {
		return "", err
	}
	return b.prefix + key, nil
}

func (b *S3Backend) Put(ctx context.Context, key string, data []byte) error {
	k, err := b.key(key)
	if err != nil {
		return err
	}
	_, err = b.client.PutObject(ctx, &s3.PutObjectInput{
		Bucket:        &b.bucket,
		Key:           &k,
		Body:          bytes.NewReader(data),
		ContentLength: aws.Int64(int64(len(data))),
	})
	if err != nil {
		return fmt.Errorf("artifacts: put %s%s: %w", b.name, key, err)
	}
	return nil
}

func (b *S3Backend) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	k, err := b.key(key)
	if err != nil {
		return nil, err
	}
	out, err := b.client.GetObject(ctx, &s3.GetObjectInput{Bucket: &b.bucket, Key: &k})
	if isNotFound(err) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	if err != nil {
		return nil, fmt.Errorf("artifacts: get %s%s: %w", b.name, key, err)
	}
	return out.Body, nil
}

func (b *S3Backend) Stat(ctx context.Context, key string) (ObjectInfo, error) {
	k, err := b.key(key)
	if err != nil {
		return ObjectInfo{}, err
	}
	out, err := b.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &b.bucket, Key: &k})
	if isNotFound(err) {
		return ObjectInfo{}, fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	if err != nil {
		return ObjectInfo{}, fmt.Errorf("artifacts: stat %s%s: %w", b.name, key, err)
	}
	return ObjectInfo{Key: key, Size: aws.ToInt64(out.ContentLength), ModTime: aws.ToTime(out.LastModified)}, nil
}

func (b *S3Backend) List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error {
	full := b.prefix + prefix
	p := s3.NewListObjectsV2Paginator(b.client, &s3.ListObjectsV2Input{Bucket: &b.bucket, Prefix: &full})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return fmt.Errorf("artifacts: list %s%s: %w", b.name, prefix, err)
		}
		for _, o := range page.Contents {
			key := strings.TrimPrefix(aws.ToString(o.Key), b.prefix)
			if checkKey(key) != nil {
				continue // not ours: something else wrote into the bucket
			}
			if err := fn(ObjectInfo{Key: key, Size: aws.ToInt64(o.Size), ModTime: aws.ToTime(o.LastModified)}); err != nil {
				return err
			}
		}
	}
	return nil
}

func (b *S3Backend) Delete(ctx context.Context, key string) error {
	k, err := b.key(key)
	if err != nil {
		return err
	}
	if _, err := b.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &b.bucket, Key: &k}); err != nil && !isNotFound(err) {
		return fmt.Errorf("artifacts: delete %s%s: %w", b.name, key, err)
	}
	return nil
}

// isNotFound recognises a missing object: GetObject says NoSuchKey, HeadObject (which has no
// body to say it in) only a 404.
func isNotFound(err error) bool {
	if err == nil {
		return false
	}
	var nsk *types.NoSuchKey
	var nf *types.NotFound
	if errors.As(err, &nsk) || errors.As(err, &nf) {
		return true
	}
	var re *awshttp.ResponseError
	return errors.As(err, &re) && re.HTTPStatusCode() == http.StatusNotFound
}

// createBucket makes the backend's bucket; the store itself never creates buckets (that needs
// rights a node should not have), but tests and benchmarks start from an empty server.
func (b *S3Backend) createBucket(ctx context.Context) error {
	_, err := b.client.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: &b.bucket})
	var owned *types.BucketAlreadyOwnedByYou
	if err != nil && !errors.As(err, &owned) {
		return fmt.Errorf("artifacts: create bucket %s: %w", b.bucket, err)
	}
	return nil
}
